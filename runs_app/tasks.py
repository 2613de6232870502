"""django-q2 task entry points. The queue only delivers: every task is a harmless no-op when
its run is not claimable, because the run's lease — not the queue — decides who works."""

from django.db import transaction
from django_q.tasks import async_task


def advance_run(run_id: str) -> str:
    from runs_app.engine.loop import run_drive

    return run_drive(run_id=run_id)


def sweep() -> dict:
    from runs_app.engine.sweeper import sweep_once

    return sweep_once()


def run_enqueue(run_id) -> None:
    """Ask a worker to drive the run, after the current transaction commits (a worker must
    never look for a run that is not committed yet)."""
    run_id = str(run_id)
    transaction.on_commit(lambda: async_task("runs_app.tasks.advance_run", run_id, task_name=f"run-{run_id}"[:100]))
