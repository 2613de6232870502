"""Reads about tool calls: the pages a user may see (sessions_app.access decides which), and the
facts about a run's writes that every interface shows — what took effect, what is in doubt."""

import json
import uuid
from decimal import Decimal, InvalidOperation

from django.db.models import BooleanField, Count, Q, QuerySet
from django.db.models.expressions import RawSQL

from approvals_app.models import ApprovalStatus
from config.pagination import keyset_page
from runs_app.models import RunOutcome
from sessions_app import access
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect


def tool_call_list(
    *, user, statuses: list[str] | None = None, run_id=None, tool_name: str | None = None, cursor: str | None = None, limit: int
) -> tuple[list[ToolCall], str | None]:
    """Newest first, keyset-paginated, one query per page."""
    queryset = access.visible_tool_calls(user=user).select_related("resolved_by", "approval", "run__session")
    if statuses:
        queryset = queryset.filter(status__in=statuses)
    if run_id:
        queryset = queryset.filter(run_id=run_id)
    if tool_name:
        queryset = queryset.filter(tool_name=tool_name)
    return keyset_page(queryset, cursor=cursor, limit=limit, position_field="created_at")


def tool_call_get(*, user, tool_call_id) -> ToolCall | None:
    return access.visible_tool_calls(user=user).select_related("resolved_by", "approval", "run__session").filter(pk=tool_call_id).first()


def applied_effects(*, run_id) -> list[dict]:
    """Writes of this run that took effect downstream: what a cancelled or failed run must show."""
    return [
        {"tool_call": str(c.id), "tool": c.tool_name, "arguments": c.arguments, "result": c.result,
         "idempotency_key": c.idempotency_key, "finished_at": c.finished_at.isoformat() if c.finished_at else None}
        # A call answered from an earlier identical one (reused_from) did not write again.
        for c in ToolCall.objects.filter(run_id=run_id, effect=ToolEffect.WRITE, status=ToolCallStatus.SUCCEEDED,
                                         reused_from__isnull=True).order_by("finished_at")
    ]


def writes_in_doubt(*, run_id) -> QuerySet[ToolCall]:
    """Writes of the run that started and whose outcome is not known: `running` (possibly in a
    worker that died) or `unknown`. No run ends — cancelled or failed — while there is one
    (SPEC §9, §10): it is recovered and reconciled first."""
    return ToolCall.objects.filter(run_id=run_id, effect=ToolEffect.WRITE,
                                   status__in=[ToolCallStatus.RUNNING, ToolCallStatus.UNKNOWN])


def run_outcome(*, run_id) -> str:
    """What the run's writes came to, in one query: `applied` when any took effect downstream
    (money moved: that outweighs everything else), else `rejected` or `expired` when a human
    decision (or its absence) stopped one, else `not_applied` when a write was asked for but
    did not happen (it failed, was reconciled as not applied, or the run ended first), else
    `none`. The same rule fills in older runs (runs_app migration 0008)."""
    counts = ToolCall.objects.filter(run_id=run_id, effect=ToolEffect.WRITE).aggregate(
        writes=Count("pk"),
        applied=Count("pk", filter=Q(status=ToolCallStatus.SUCCEEDED)),
        rejected=Count("approval", filter=Q(approval__status=ApprovalStatus.REJECTED)),
        expired=Count("approval", filter=Q(approval__status=ApprovalStatus.EXPIRED)),
    )
    if counts["applied"]:
        return RunOutcome.APPLIED
    if counts["rejected"]:
        return RunOutcome.REJECTED
    if counts["expired"]:
        return RunOutcome.EXPIRED
    return RunOutcome.NOT_APPLIED if counts["writes"] else RunOutcome.NONE


def _argument_value_path(term: str) -> str:
    """A jsonpath matching `term` as any argument's value, at any depth, as a string or (when it
    reads as one) a number: "9527" finds {"order_id": "9527"} and {"order_id": 9527}. The GIN
    index tool_call_arguments_search answers it (the `@?` operator)."""
    candidates = [json.dumps(term)]
    try:
        number = Decimal(term)
    except InvalidOperation:
        number = None
    if number is not None and number.is_finite() and len(term) <= 30:
        candidates.append(format(number, "f"))
    return "$.** ? (" + " || ".join(f"@ == {value}" for value in candidates) + ")"


def tool_calls_matching(*, term: str) -> QuerySet[ToolCall]:
    """Tool calls a desk search for `term` finds: by any argument's value (an order number, an
    amount, a city), by idempotency key, or by id. Exact values, so every branch is an index look-up."""
    term = term.strip()
    if not term or "\x00" in term:
        return ToolCall.objects.none()
    matches = Q(RawSQL('"tools_app_toolcall"."arguments" @? %s::jsonpath', [_argument_value_path(term)],
                       output_field=BooleanField())) | Q(idempotency_key=term)
    try:
        matches |= Q(pk=uuid.UUID(term))
    except ValueError:
        pass
    return ToolCall.objects.filter(matches)
