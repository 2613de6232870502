"""The sweeper (SPEC §5): re-queues runs whose lease expired, wakes runs whose backoff
elapsed, expires overdue approvals, reminds and escalates approvals past their agent's service
level (never deciding them), reconciles unknown writes, fails runs past their deadline,
and re-enqueues queued runs whose task may have been lost. Every action is a conditional
write, so any number of sweepers may run at once."""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, TextField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.utils import timezone

from agents.service_levels import escalate_after_of, remind_after_of, service_level_of
from approvals_app.models import Approval, ApprovalPolicy, ApprovalStatus
from engine.actions.approvals import approval_escalate, approval_expire, approval_expiry_warn, approval_remind
from engine.actions.messages import input_wait_expire
from engine.actions.reconciliation import tool_call_reconcile_auto
from engine.actions.runs import run_end, run_resume
from engine.queue import run_enqueue, run_enqueue_now, tasks_waiting
from engine.state import lease_revoke_expired, run_row_lock
from operations import liveness
from operations.models import OpenStream
from runs_app.events import RunEventType
from runs_app.models import DEADLINE_PAUSED_WAITS, Run, RunErrorCode, RunEvent, RunStatus, WaitReason
from sessions_app.models import IdempotencyRecord, RateCounter
from sessions_app.services import session_lock
from tools_app.models import ToolCall, ToolCallStatus
from tools_app.registry import ASK_USER
from tools_app.selectors import writes_in_doubt

logger = logging.getLogger("warden.sweeper")
BATCH = 100


def sweep_once() -> dict:
    now = timezone.now()
    counts = {
        "leases_revoked": _revoke_expired_leases(now),
        "backoffs_woken": _wake_backoffs(now),
        "approvals_expired": _expire_approvals(now),
        "questions_expired": _expire_questions(now),
        "approvals_warned": _warn_expiring_approvals(now),
        **_service_levels(now),
        "waits_healed": _heal_waits(),
        "reconciled": _reconcile(now),
        "deadlines_failed": _fail_past_deadline(now),
        "requeued": _reenqueue_stale(now),
        "idempotency_keys_purged": _purge_idempotency_keys(now),
        "counters_purged": _purge_counters(now),
    }
    if any(counts.values()):
        logger.info("sweep: %s", counts, extra={"sweep": counts})
    liveness.sweep_recorded(counts)
    return counts


def _revoke_expired_leases(now) -> int:
    revoked = 0
    for run_id in Run.objects.filter(status=RunStatus.RUNNING, lease_expires_at__lt=now).values_list("pk", flat=True)[:BATCH]:
        if lease_revoke_expired(run_id=run_id) is not None:
            run_enqueue(run_id)
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


def _expire_questions(now) -> int:
    due = Run.objects.filter(status=RunStatus.WAITING, wait_reason=WaitReason.WAITING_INPUT, expires_at__lte=now)
    return sum(input_wait_expire(run_id=run_id) for run_id in due.values_list("pk", flat=True)[:BATCH])


def _warn_expiring_approvals(now) -> int:
    """Pending approvals that expire within WARDEN_APPROVAL_WARNING_SECONDS get their one
    `approval_expiring` event (and so their notification)."""
    warned = RunEvent.objects.annotate(warned_approval=KeyTextTransform("approval", "payload")).filter(
        run_id=OuterRef("run_id"), type=RunEventType.APPROVAL_EXPIRING, warned_approval=Cast(OuterRef("pk"), TextField()))
    horizon = now + timedelta(seconds=settings.WARDEN_APPROVAL_WARNING_SECONDS)
    due = Approval.objects.filter(status=ApprovalStatus.PENDING, expires_at__gt=now, expires_at__lte=horizon).exclude(Exists(warned))
    return sum(approval_expiry_warn(approval=approval) for approval in due.order_by("expires_at")[:BATCH])


def _service_levels(now) -> dict[str, int]:
    """Pending operator approvals past their agent's service level (docs/NOTIFICATIONS.md): reminded
    once at `remind_after`, escalated once at `escalate_after` (which takes the reminder's place
    when both are due). Each is a conditional write, so two sweepers never do either twice; nothing
    is ever approved here."""
    counts = {"approvals_reminded": 0, "approvals_escalated": 0}
    due = (Approval.objects.filter(status=ApprovalStatus.PENDING, policy=ApprovalPolicy.OPERATOR, escalated_at__isnull=True,
                                   expires_at__gt=now, run__agent_version__approval_service_levels__has_key="operator")
           .select_related("run__agent_version").order_by("requested_at"))
    for approval in due[:BATCH]:
        level = service_level_of(approval.run.agent_version, approval.policy)
        escalate_after, remind_after = escalate_after_of(level), remind_after_of(level)
        if escalate_after is not None and approval.requested_at + escalate_after <= now:
            counts["approvals_escalated"] += approval_escalate(approval=approval, group=level["escalate_to"],
                                                               after=level["escalate_after"])
        elif remind_after is not None and approval.reminded_at is None and approval.requested_at + remind_after <= now:
            counts["approvals_reminded"] += approval_remind(approval=approval)
    return counts


def _heal_waits() -> int:
    """A run waiting for something that already happened (the deciding commit raced the run's
    suspension) is woken; without this it would wait forever."""
    pending_approval = Approval.objects.filter(run=OuterRef("pk"), status=ApprovalStatus.PENDING)
    unknown_call = ToolCall.objects.filter(run=OuterRef("pk"), status=ToolCallStatus.UNKNOWN)
    open_question = ToolCall.objects.filter(run=OuterRef("pk"), tool_name=ASK_USER, status=ToolCallStatus.PENDING)
    stale = list(
        Run.objects.filter(status=RunStatus.WAITING, wait_reason=WaitReason.WAITING_INPUT)
        .exclude(Exists(open_question)).values_list("pk", flat=True)[:BATCH]
    ) + list(
        Run.objects.filter(status=RunStatus.WAITING, wait_reason=WaitReason.APPROVAL)
        .exclude(Exists(pending_approval)).values_list("pk", flat=True)[:BATCH]
    ) + list(
        Run.objects.filter(status=RunStatus.WAITING, wait_reason=WaitReason.RECONCILIATION)
        .exclude(Exists(unknown_call)).values_list("pk", flat=True)[:BATCH]
    )
    healable = [WaitReason.APPROVAL, WaitReason.RECONCILIATION, WaitReason.WAITING_INPUT]
    return sum(run_resume(run_id=run_id, wait_reasons=healable) for run_id in stale)


def _reconcile(now) -> int:
    resolved = 0
    for call in ToolCall.objects.filter(status=ToolCallStatus.UNKNOWN, next_attempt_at__lte=now).order_by("next_attempt_at")[:BATCH]:
        resolved += tool_call_reconcile_auto(tool_call=call) == "resolved"
    return resolved


def _fail_past_deadline(now) -> int:
    """Queued runs and runs in a backoff past their deadline fail, closing what never started.
    Not while a write is in doubt — queued with a write a dead worker left `running`: a worker
    recovers and reconciles it first, and the deadline fails the run after."""
    failed = 0
    # A run waiting for a person is not on its own clock: the approval's or the question's expiry
    # ends that wait (DEADLINE_PAUSED_WAITS), and the deadline is extended when it resumes.
    overdue = Run.objects.filter(status__in=[RunStatus.QUEUED, RunStatus.WAITING], deadline__lt=now).exclude(
        wait_reason__in=DEADLINE_PAUSED_WAITS
    ).exclude(Exists(writes_in_doubt(run_id=OuterRef("pk"))))
    for run in overdue[:BATCH]:
        with transaction.atomic():
            session_lock(session_id=run.session_id)
            run = run_row_lock(run_id=run.pk)
            if (run.status not in (RunStatus.QUEUED, RunStatus.WAITING) or run.wait_reason in DEADLINE_PAUSED_WAITS
                    or writes_in_doubt(run_id=run.id).exists()):
                continue
            failed += run_end(run=run, to=RunStatus.FAILED, lease_token=None, error_code=RunErrorCode.DEADLINE,
                              error_detail=f"the run passed its deadline {run.deadline.isoformat()}")
    return failed


def _purge_idempotency_keys(now) -> int:
    oldest_kept = now - timedelta(seconds=settings.WARDEN_IDEMPOTENCY_KEY_TTL_SECONDS)
    stale = IdempotencyRecord.objects.filter(created_at__lt=oldest_kept).values_list("pk", flat=True)[:1000]
    return IdempotencyRecord.objects.filter(pk__in=list(stale)).delete()[0]


def _purge_counters(now) -> int:
    """Rate-limit windows nobody is counted in any more, and live-connection slots whose process
    died without giving them back (config/throttling.py, operations/streams.py)."""
    windows = RateCounter.objects.filter(expires__lt=int(now.timestamp())).values_list("pk", flat=True)[:5000]
    purged = RateCounter.objects.filter(pk__in=list(windows)).delete()[0]
    return purged + OpenStream.objects.filter(expires_at__lt=now).delete()[0]


def _reenqueue_stale(now) -> int:
    """Tasks are delivered at least zero times if a process dies between commit and enqueue;
    duplicates are harmless (the lease decides), so re-enqueue queued runs nobody took.

    Not while the broker still holds as many untaken tasks as there are queued runs: then the runs
    wait for workers, not for a lost task, and every sweep of an overloaded fleet added a task per
    waiting run to the queue it waited in (the chaos soak saw thousands). A run whose task was lost
    is asked for again once the queue holds fewer tasks than queued runs — it drains as workers free."""
    stale_after = timedelta(seconds=max(5.0, 2 * settings.WARDEN_SWEEP_SECONDS))
    run_ids = list(Run.objects.filter(status=RunStatus.QUEUED, updated_at__lt=now - stale_after).values_list("pk", flat=True)[:BATCH])
    if not run_ids:
        return 0
    waiting = tasks_waiting()
    if waiting is not None and waiting >= Run.objects.filter(status=RunStatus.QUEUED).count():
        liveness.count("sweeper:requeue-deferred", len(run_ids))
        return 0
    for run_id in run_ids:
        run_enqueue_now(run_id)
        Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(updated_at=timezone.now())
    return len(run_ids)
