"""django-q2 task entry points. Every task is a harmless no-op when its run is not claimable,
because the run's lease — not the queue — decides who works."""

from engine.loop import run_drive
from engine.sweeper import sweep_once
from engine.webhooks import webhooks_deliver_due


def advance_run(run_id: str) -> str:
    return run_drive(run_id=run_id)


def sweep() -> dict:
    """The schedule's sweep (every minute where no `sweep --loop` runs) also sends the webhook
    deliveries that are due: retries wait for it there."""
    counts = sweep_once()
    counts["webhooks_attempted"] = webhooks_deliver_due()
    return counts


def deliver_webhooks() -> int:
    """Asked for after each commit that wrote outbox rows (notifications.outbox)."""
    return webhooks_deliver_due()
