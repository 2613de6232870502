"""Pending input (SPEC §8): how the run-time read an input that arrived while a run was busy, and the
input consumed — joined to the active run as a supplement, or the start of the next run. Each input
is consumed once: the write is conditional on it still being pending."""

from django.utils import timezone

from sessions_app.models import Message, PendingInput


def input_resolve(*, pending_id: int, mode: str, reason: str | None = None) -> None:
    """How the input is to be taken (a supplement, a new intent…), as the classifier — or the
    poster's own mode — decided; `reason` is the classifier's, when it decided."""
    values = {"resolved_mode": mode, **({"classification_reason": reason[:300]} if reason is not None else {})}
    PendingInput.objects.filter(pk=pending_id).update(**values)


def input_consume(*, pending: PendingInput, run_id, disposition: str, resolved_mode: str, message: Message) -> bool:
    """The input became `message` of run `run_id` (`disposition`: supplemented, or a new run);
    False when it was consumed already."""
    return bool(PendingInput.objects.filter(pk=pending.pk, consumed_at__isnull=True).update(
        consumed_at=timezone.now(), consumed_by_id=run_id, disposition=disposition, resolved_mode=resolved_mode,
        message=message,
    ))
