"""Retention and erasure (SPEC §16): history is append-only while it matters, and erasable when a
retention period ends or a person asks to be forgotten — through this one audited path, which
archives a session to a file before anything is deleted and never touches a session whose run
is still active. The append-only triggers let only this path through (sessions_app migration
0005: the transaction sets `warden.erasure`). Audit entries are kept, detached from the runs they
were about; one more entry records the erasure itself."""

import json
import os
from dataclasses import dataclass, field
from typing import IO

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import Q, QuerySet

from approvals_app.models import Approval, ApprovalDecision, AuditEntry
from approvals_app.services import audit_record
from runs_app.models import ACTIVE_STATUSES, ContextSummary, Run, RunEvent, Step
from notifications.models import WebhookAttempt, WebhookDelivery
from sessions_app.models import IdempotencyRecord, Message, PendingInput, Session
from sessions_app.services import session_lock
from tools_app.models import ToolCall


@dataclass
class ErasureReport:
    erased: list[str] = field(default_factory=list)
    skipped_active: list[str] = field(default_factory=list)
    messages: int = 0
    runs: int = 0


def _rows(queryset) -> list[dict]:
    return list(queryset.values())


def session_archive_record(session: Session) -> dict:
    """Everything Warden holds about a session, as one JSON-able record."""
    runs = Run.objects.filter(session=session)
    return {
        "session": _rows(Session.objects.filter(pk=session.pk))[0],
        "messages": _rows(Message.objects.filter(session=session).order_by("seq")),
        "pending_inputs": _rows(PendingInput.objects.filter(session=session).order_by("id")),
        "summaries": _rows(ContextSummary.objects.filter(session=session)),
        "runs": _rows(runs.order_by("created_at")),
        "steps": _rows(Step.objects.filter(run__in=runs).order_by("run_id", "index")),
        "events": _rows(RunEvent.objects.filter(run__in=runs).order_by("run_id", "seq")),
        "tool_calls": _rows(ToolCall.objects.filter(run__in=runs).order_by("created_at")),
        "approvals": _rows(Approval.objects.filter(run__in=runs).order_by("requested_at")),
        "approval_decisions": _rows(ApprovalDecision.objects.filter(approval__run__in=runs).order_by("id")),
        "audit": _rows(AuditEntry.objects.filter(run__in=runs).order_by("created_at")),
        "webhook_deliveries": _rows(WebhookDelivery.objects.filter(run__in=runs).order_by("created_at")),
    }


def _idempotency_records(session: Session, runs) -> QuerySet[IdempotencyRecord]:
    """Stored API responses about the session or its runs (their bodies hold its messages): its
    owner's records whose path or response names the session or one of its runs."""
    ids = [str(session.pk), *(str(pk) for pk in runs.values_list("pk", flat=True))]
    about = [
        record.pk
        for record in IdempotencyRecord.objects.filter(owner_id=session.owner_id).only("pk", "path", "response_body")
        if any(i in record.path or i.encode() in bytes(record.response_body) for i in ids)
    ]
    return IdempotencyRecord.objects.filter(pk__in=about)


def sessions_erase(*, sessions: QuerySet[Session], archive: IO[str], acting_user=None, reason: str) -> ErasureReport:
    """Archive, then erase, each of `sessions` that has no active run; one transaction per
    session, the archive line written and flushed to disk before its rows go."""
    report = ErasureReport()
    for session_id in list(sessions.values_list("pk", flat=True)):
        with transaction.atomic():
            session_lock(session_id=session_id)
            session = Session.objects.get(pk=session_id)
            if Run.objects.filter(session=session, status__in=ACTIVE_STATUSES).exists():
                report.skipped_active.append(str(session_id))
                continue
            record = session_archive_record(session)
            archive.write(json.dumps(record, cls=DjangoJSONEncoder) + "\n")
            archive.flush()
            os.fsync(archive.fileno())
            report.messages += len(record["messages"])
            report.runs += len(record["runs"])
            _erase(session)
            audit_record(actor=acting_user, action="erase", obj=session, before={
                "messages": len(record["messages"]), "runs": len(record["runs"]), "owner": session.owner_id,
            }, after={"erased": True, "archive": getattr(archive, "name", "")}, note=reason)
            report.erased.append(str(session_id))
    return report


def _erase(session: Session) -> None:
    """Delete the session's rows. Foreign keys are checked at commit, so the order only has to
    leave nothing pointing at a deleted row by then."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL warden.erasure = 'on'")
    runs = Run.objects.filter(session=session)
    AuditEntry.objects.filter(run__in=runs).update(run=None)
    # Notifications about the runs carry their text too; their delivery log goes with them.
    WebhookAttempt.objects.filter(delivery__run__in=runs).delete()
    WebhookDelivery.objects.filter(run__in=runs).delete()
    _idempotency_records(session, runs).delete()
    RunEvent.objects.filter(run__in=runs).delete()
    ApprovalDecision.objects.filter(approval__run__in=runs).delete()
    Approval.objects.filter(run__in=runs).delete()
    # Calls of other sessions that an erased call answered (the same business key) keep their own
    # outcome and lose the link; the erased key can then be asked for again (docs/OPERATIONS.md).
    ToolCall.objects.filter(Q(run__in=runs) | Q(reused_from__run__in=runs)).update(reused_from=None)
    ToolCall.objects.filter(run__in=runs).delete()
    PendingInput.objects.filter(session=session).delete()
    Message.objects.filter(session=session).delete()
    Step.objects.filter(run__in=runs).delete()
    ContextSummary.objects.filter(session=session).delete()
    runs.update(retry_of=None)
    runs.delete()
    Session.objects.filter(pk=session.pk).delete()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL warden.erasure = 'off'")
