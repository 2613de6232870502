"""The sweeper (SPEC §5): re-queues runs whose lease expired, wakes runs whose backoff
elapsed, expires overdue approvals, reconciles unknown writes, fails runs past their deadline,
and re-enqueues queued runs whose task may have been lost. Every action is a conditional
write, so any number of sweepers may run at once."""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from approvals_app.models import Approval, ApprovalStatus
from engine.actions.approvals import approval_expire
from engine.actions.reconciliation import tool_call_reconcile_auto
from engine.actions.runs import run_end, run_resume
from engine.queue import run_enqueue, run_enqueue_now
from runs_app.models import Run, RunErrorCode, RunStatus, WaitReason
from runs_app.services import run_transition
from sessions_app.services import session_lock
from tools_app.models import ToolCall, ToolCallStatus
from tools_app.selectors import writes_in_doubt

logger = logging.getLogger("warden.sweeper")
BATCH = 100


def sweep_once() -> dict:
    now = timezone.now()
    counts = {
        "leases_revoked": _revoke_expired_leases(now),
        "backoffs_woken": _wake_backoffs(now),
        "approvals_expired": _expire_approvals(now),
        "waits_healed": _heal_waits(),
        "reconciled": _reconcile(now),
        "deadlines_failed": _fail_past_deadline(now),
        "requeued": _reenqueue_stale(now),
    }
    if any(counts.values()):
        logger.info("sweep: %s", counts)
    return counts


def _revoke_expired_leases(now) -> int:
    revoked = 0
    for run_id in Run.objects.filter(status=RunStatus.RUNNING, lease_expires_at__lt=now).values_list("pk", flat=True)[:BATCH]:
        with transaction.atomic():
            run = (
                Run.objects.select_for_update(skip_locked=True, no_key=True)  # no_key: see session_lock
                .filter(pk=run_id, status=RunStatus.RUNNING, lease_expires_at__lt=timezone.now())
                .first()
            )
            if run is None:
                continue
            # Fence on the token we saw and bump it: the stalled holder's writes now match nothing.
            if run_transition(
                run=run, to=RunStatus.QUEUED, lease_token=run.lease_token, new_lease_token=True,
                event_payload={"reason": "lease expired", "previous_owner": run.lease_owner, "previous_lease_token": run.lease_token},
            ):
                run_enqueue(run.id)
                revoked += 1
    return revoked


def _wake_backoffs(now) -> int:
    due = Run.objects.filter(status=RunStatus.WAITING, wait_reason=WaitReason.RETRY_BACKOFF, expires_at__lte=now)
    return sum(run_resume(run_id=run_id, wait_reasons=[WaitReason.RETRY_BACKOFF]) for run_id in due.values_list("pk", flat=True)[:BATCH])


def _expire_approvals(now) -> int:
    expired = 0
    for approval in Approval.objects.filter(status=ApprovalStatus.PENDING, expires_at__lte=now)[:BATCH]:
        expired += approval_expire(approval=approval)
    return expired


def _heal_waits() -> int:
    """A run waiting for something that already happened (the deciding commit raced the run's
    suspension) is woken; without this it would wait forever."""
    pending_approval = Approval.objects.filter(run=OuterRef("pk"), status=ApprovalStatus.PENDING)
    unknown_call = ToolCall.objects.filter(run=OuterRef("pk"), status=ToolCallStatus.UNKNOWN)
    stale = list(
        Run.objects.filter(status=RunStatus.WAITING, wait_reason=WaitReason.APPROVAL)
        .exclude(Exists(pending_approval)).values_list("pk", flat=True)[:BATCH]
    ) + list(
        Run.objects.filter(status=RunStatus.WAITING, wait_reason=WaitReason.RECONCILIATION)
        .exclude(Exists(unknown_call)).values_list("pk", flat=True)[:BATCH]
    )
    return sum(run_resume(run_id=run_id, wait_reasons=[WaitReason.APPROVAL, WaitReason.RECONCILIATION]) for run_id in stale)


def _reconcile(now) -> int:
    resolved = 0
    for call in ToolCall.objects.filter(status=ToolCallStatus.UNKNOWN, next_attempt_at__lte=now).order_by("next_attempt_at")[:BATCH]:
        resolved += tool_call_reconcile_auto(tool_call=call) == "resolved"
    return resolved


def _fail_past_deadline(now) -> int:
    """Queued or waiting runs past their deadline fail, closing what never started (a pending
    approval is withdrawn). Not while a write is in doubt — waiting on reconciliation, or
    queued with a write a dead worker left `running`: a worker recovers and reconciles it
    first, and the deadline fails the run after."""
    failed = 0
    overdue = Run.objects.filter(status__in=[RunStatus.QUEUED, RunStatus.WAITING], deadline__lt=now).exclude(
        wait_reason=WaitReason.RECONCILIATION
    ).exclude(Exists(writes_in_doubt(run_id=OuterRef("pk"))))
    for run in overdue[:BATCH]:
        with transaction.atomic():
            session_lock(session_id=run.session_id)
            run = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
            if run.status not in (RunStatus.QUEUED, RunStatus.WAITING) or writes_in_doubt(run_id=run.id).exists():
                continue
            failed += run_end(run=run, to=RunStatus.FAILED, lease_token=None, error_code=RunErrorCode.DEADLINE,
                              error_detail=f"the run passed its deadline {run.deadline.isoformat()}")
    return failed


def _reenqueue_stale(now) -> int:
    """Tasks are delivered at least zero times if a process dies between commit and enqueue;
    duplicates are harmless (the lease decides), so re-enqueue queued runs nobody took."""
    stale_after = timedelta(seconds=max(5.0, 2 * settings.WARDEN_SWEEP_SECONDS))
    run_ids = list(Run.objects.filter(status=RunStatus.QUEUED, updated_at__lt=now - stale_after).values_list("pk", flat=True)[:BATCH])
    for run_id in run_ids:
        run_enqueue_now(run_id)
        Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(updated_at=timezone.now())
    return len(run_ids)
