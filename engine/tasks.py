"""django-q2 task entry points. Every task is a harmless no-op when its run is not claimable,
because the run's lease — not the queue — decides who works."""

import multiprocessing

from django.conf import settings

from engine.executor import run_executor
from engine.loop import run_drive
from engine.mailer import mails_send_due
from engine.sweeper import sweep_once
from engine.webhooks import webhooks_deliver_due


def advance_run(run_id: str) -> str:
    """In a worker process of a cluster (WARDEN_RUNS_PER_WORKER > 1) the run is handed to one of
    the process's run threads, once one is free (engine/executor.py); else driven here."""
    if settings.WARDEN_RUNS_PER_WORKER > 1 and _in_q_worker():
        return run_executor().submit(run_id)
    return run_drive(run_id=run_id)


def _in_q_worker() -> bool:
    # django-q2 runs tasks inline (`sync`) in tests and from `async_task(..., sync=True)`.
    return multiprocessing.parent_process() is not None


def sweep() -> dict:
    """The schedule's sweep (every minute where no `sweep --loop` runs) also sends the webhook
    deliveries and e-mails that are due: retries wait for it there."""
    counts = sweep_once()
    counts["webhooks_attempted"] = webhooks_deliver_due()
    counts["emails_attempted"] = mails_send_due()
    return counts


def deliver_webhooks() -> int:
    """Asked for after each commit that wrote outbox rows (notifications.outbox): webhooks and e-mails."""
    return webhooks_deliver_due() + mails_send_due()
