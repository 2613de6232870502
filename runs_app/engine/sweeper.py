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
from runs_app.models import Run, RunErrorCode, RunStatus, WaitReason
from runs_app.services import run_resume, run_transition
from tools_app.models import ToolCall, ToolCallStatus

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
    from runs_app.tasks import run_enqueue

    revoked = 0
    for run_id in Run.objects.filter(status=RunStatus.RUNNING, lease_expires_at__lt=now).values_list("pk", flat=True)[:BATCH]:
        with transaction.atomic():
            run = (
                Run.objects.select_for_update(skip_locked=True)
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
    from approvals_app.services import approval_expire

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
    from tools_app.reconciliation import tool_call_reconcile_auto

    resolved = 0
    for call in ToolCall.objects.filter(status=ToolCallStatus.UNKNOWN, next_attempt_at__lte=now).order_by("next_attempt_at")[:BATCH]:
        resolved += tool_call_reconcile_auto(tool_call=call) == "resolved"
    return resolved


def _fail_past_deadline(now) -> int:
    """Queued or waiting runs past their deadline fail, closing what never started (a pending
    approval is withdrawn). Not while a write is in doubt — waiting on reconciliation, or
    queued with a write a dead worker left `running`: a worker recovers and reconciles it
    first, and the deadline fails the run after."""
    from runs_app.engine.cancel import run_close_unstarted, writes_in_doubt
    from sessions_app.services import session_lock, session_start_next_run

    failed = 0
    overdue = Run.objects.filter(status__in=[RunStatus.QUEUED, RunStatus.WAITING], deadline__lt=now).exclude(
        wait_reason=WaitReason.RECONCILIATION
    ).exclude(Exists(writes_in_doubt(run_id=OuterRef("pk"))))
    for run in overdue[:BATCH]:
        with transaction.atomic():
            session_lock(session_id=run.session_id)
            run = Run.objects.select_for_update().get(pk=run.pk)
            if run.status not in (RunStatus.QUEUED, RunStatus.WAITING):
                continue
            run_close_unstarted(run=run, lease_token=None, code="run_failed", why="the run failed")
            if run_transition(
                run=run, to=RunStatus.FAILED, error_code=RunErrorCode.DEADLINE,
                error_detail=f"the run passed its deadline {run.deadline.isoformat()}",
            ):
                session_start_next_run(session_id=run.session_id)
                failed += 1
    return failed


def _reenqueue_stale(now) -> int:
    """Tasks are delivered at least zero times if a process dies between commit and enqueue;
    duplicates are harmless (the lease decides), so re-enqueue queued runs nobody took."""
    from django_q.tasks import async_task

    stale_after = timedelta(seconds=max(5.0, 2 * settings.WARDEN_SWEEP_SECONDS))
    run_ids = list(Run.objects.filter(status=RunStatus.QUEUED, updated_at__lt=now - stale_after).values_list("pk", flat=True)[:BATCH])
    for run_id in run_ids:
        async_task("runs_app.tasks.advance_run", str(run_id))
        Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(updated_at=timezone.now())
    return len(run_ids)
