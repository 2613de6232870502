"""Asking for a worker. The queue only delivers (PITFALLS.md, django-q2): duplicate or lost
deliveries are harmless because a run's lease, not the queue, decides who works on it."""

import logging

from django.db import transaction
from django_q.brokers import get_broker
from django_q.tasks import async_task

logger = logging.getLogger("warden.engine")

# The task entry points (engine/tasks.py), by the dotted path django-q2 stores in its rows.
ADVANCE_RUN_TASK = "engine.tasks.advance_run"
SWEEP_TASK = "engine.tasks.sweep"


def run_enqueue_now(run_id) -> None:
    run_id = str(run_id)
    # save=False: a slice that ends well leaves no row in django-q2's task history (its failures still
    # do). The run's own rows are its record; and with save_limit set, the monitor saving a success
    # first reads and locks the whole history (up to save_limit rows) to prune it — at a thousand runs
    # in flight that cost ~2.5 ms of CPU per slice, more than the monitor's share of everything else.
    async_task(ADVANCE_RUN_TASK, run_id, task_name=f"run-{run_id}"[:100], save=False)


def run_enqueue(run_id) -> None:
    """Ask a worker to drive the run, after the current transaction commits (a worker must
    never look for a run that is not committed yet)."""
    transaction.on_commit(lambda: run_enqueue_now(run_id))


def tasks_waiting() -> int | None:
    """Tasks the broker holds that no cluster has taken yet; None when the broker cannot say."""
    try:
        return get_broker().queue_size()
    except Exception:  # noqa: BLE001 - a broker that cannot count is asked nothing more of
        logger.warning("the task broker could not count its waiting tasks", exc_info=True)
        return None
