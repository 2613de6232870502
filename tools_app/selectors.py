"""Reads about tool calls: pages of the calls a caller may see (the access policy's queryset, given
by the caller), the facts about a run's writes that every interface shows — what took effect,
what is in doubt — and the desk's search by business key."""

import json
import uuid
from decimal import Decimal, InvalidOperation

from django.contrib.auth import get_user_model
from django.contrib.postgres.aggregates import JSONBAgg
from django.db.models import BooleanField, JSONField, OuterRef, Q, QuerySet, Subquery
from django.db.models.expressions import RawSQL
from django.db.models.functions import JSONObject

from config.pagination import keyset_page
from runs_app.models import Run
from runs_app.selectors import run_session_owner_in
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect
from tools_app.registry import tool_get

# A desk search stops collecting matches here: it narrows a list, it is not an export.
SEARCH_LIMIT = 2000


def tool_call_list(
    *, tool_calls: QuerySet[ToolCall], statuses: list[str] | None = None, run_id=None, tool_name: str | None = None, cursor: str | None = None, limit: int
) -> tuple[list[ToolCall], str | None]:
    """Newest first, keyset-paginated, one query per page; of `tool_calls` (access.visible_tool_calls)."""
    queryset = tool_calls.select_related("resolved_by", "approval", "run__session")
    if statuses:
        queryset = queryset.filter(status__in=statuses)
    if run_id:
        queryset = queryset.filter(run_id=run_id)
    if tool_name:
        queryset = queryset.filter(tool_name=tool_name)
    return keyset_page(queryset, cursor=cursor, limit=limit, position_field="created_at")


def tool_call_get(*, tool_calls: QuerySet[ToolCall], tool_call_id) -> ToolCall | None:
    return tool_calls.select_related("resolved_by", "approval", "run__session").filter(pk=tool_call_id).first()


def tool_calls_of_run(*, run_id) -> list[ToolCall]:
    return list(ToolCall.objects.filter(run_id=run_id).select_related("resolved_by", "approval", "step", "run__session")
                .order_by("step__index", "index"))


# A write that took effect downstream. A call answered from an earlier identical one (reused_from)
# did not write again.
APPLIED_WRITE = Q(effect=ToolEffect.WRITE, status=ToolCallStatus.SUCCEEDED, reused_from__isnull=True)


def applied_effects(*, run_id) -> list[dict]:
    """Writes of this run that took effect downstream: what a cancelled or failed run must show."""
    return [
        {"tool_call": str(c.id), "tool": c.tool_name, "arguments": c.arguments, "result": c.result,
         "idempotency_key": c.idempotency_key, "finished_at": c.finished_at.isoformat() if c.finished_at else None}
        for c in ToolCall.objects.filter(APPLIED_WRITE, run_id=run_id).order_by("finished_at")
    ]


def applied_writes_column() -> Subquery:
    """For a page of runs (runs_app.selectors.run_list's `columns`): each run's writes that took
    effect, as [{"tool", "arguments"}] — the calls of `applied_effects` — read in the page's query."""
    writes = (ToolCall.objects.filter(APPLIED_WRITE, run_id=OuterRef("pk")).values("run_id")
              .annotate(writes=JSONBAgg(JSONObject(tool="tool_name", arguments="arguments"))).values("writes"))
    return Subquery(writes, output_field=JSONField())


def money_moved(writes: list[dict] | None) -> list[dict]:
    """What applied writes moved, summed per currency, as their tools declare amounts (Tool.money_of,
    what the desk and the events show): [{"amount": "9.00", "currency": "EUR"}]; [] for none."""
    totals: dict[str | None, Decimal] = {}
    for write in writes or ():
        tool = tool_get(write["tool"])
        amount, currency = tool.money_of(write["arguments"]) if tool is not None else (None, None)
        if amount is not None:
            totals[currency] = totals.get(currency, Decimal(0)) + amount
    return [{"amount": str(amount), "currency": currency}
            for currency, amount in sorted(totals.items(), key=lambda total: total[0] or "")]


def writes_in_doubt(*, run_id) -> QuerySet[ToolCall]:
    """Writes of the run that started and whose outcome is not known: `running` (possibly in a
    worker that died) or `unknown`. No run ends — cancelled or failed — while there is one
    (SPEC §9, §10): it is recovered and reconciled first."""
    return ToolCall.objects.filter(run_id=run_id, effect=ToolEffect.WRITE,
                                   status__in=[ToolCallStatus.RUNNING, ToolCallStatus.UNKNOWN])


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
    amount, a city), by business key or idempotency key, or by id. Exact values, so every branch is an index look-up."""
    term = term.strip()
    if not term or "\x00" in term:
        return ToolCall.objects.none()
    matches = Q(RawSQL('"tools_app_toolcall"."arguments" @? %s::jsonpath', [_argument_value_path(term)],
                       output_field=BooleanField())) | Q(idempotency_key=term) | Q(business_key=term)
    try:
        matches |= Q(pk=uuid.UUID(term))
    except ValueError:
        pass
    return ToolCall.objects.filter(matches)


def runs_calling(*, tool_name: str) -> QuerySet:
    """The ids of the runs that called `tool_name`, as a subquery (the tool_call_tool_run index)."""
    return ToolCall.objects.filter(tool_name=tool_name).values("run_id")


def run_ids_matching(*, term: str, limit: int = SEARCH_LIMIT) -> list:
    """Runs a desk search for `term` finds, by business key: an order number or any other tool
    argument, an idempotency key, the customer (username), the session's title, or an id (run,
    session, tool call). Each branch is its own index look-up; the union is capped at `limit`."""
    term = term.strip()
    if not term or "\x00" in term:
        return []
    found: dict = {}

    def add(ids) -> None:
        for pk in ids:
            if len(found) >= limit:
                return
            found.setdefault(pk, None)

    try:
        as_uuid = uuid.UUID(term)
    except ValueError:
        as_uuid = None
    if as_uuid is not None:
        add(Run.objects.filter(pk=as_uuid).values_list("pk", flat=True))
        add(Run.objects.filter(session_id=as_uuid).values_list("pk", flat=True)[:limit])
    add(tool_calls_matching(term=term).order_by().values_list("run_id", flat=True)[:limit])
    owners = list(get_user_model().objects.filter(username__icontains=term).values_list("pk", flat=True)[:20])
    if owners:
        add(Run.objects.filter(run_session_owner_in(owners)).order_by("-created_at").values_list("pk", flat=True)[:limit])
    # Unordered: ordered by time, PostgreSQL would walk every run newest first looking for these.
    add(Run.objects.filter(session__title__icontains=term).order_by().values_list("pk", flat=True)[:limit])
    return list(found)


def writes_spent(*, tool_name: str, since, per: str, value: str, amount_argument: str | None,
                 currency_argument: str | None, currency: str | None, exclude_pk=None) -> tuple[Decimal, int]:
    """What a limit's window holds before a new call (agents.limits): the sum of `amount_argument`
    and the count of the tool's calls created since `since`, of one customer (`per` "customer":
    the session's owner id), one agent (its id) or one counterparty (an argument's value), in
    `currency` when the tool's currency is an argument. Every call counts from its creation —
    pending approval, running, `unknown` and succeeded — except those that definitely did not
    take effect (failed, cancelled), those a guard refused, and those answered by an earlier call."""
    calls = (ToolCall.objects.filter(tool_name=tool_name, effect=ToolEffect.WRITE, created_at__gte=since,
                                     reused_from__isnull=True)
             .exclude(status__in=(ToolCallStatus.FAILED, ToolCallStatus.CANCELLED))
             .exclude(guard__has_key="refused"))
    if exclude_pk is not None:
        calls = calls.exclude(pk=exclude_pk)
    if per == "customer":
        calls = calls.filter(run__session__owner_id=value)
    elif per == "agent":
        calls = calls.filter(run__agent_version__agent_id=value)
    else:
        calls = calls.filter(arguments__contains={per: value})
    if currency_argument and currency:
        calls = calls.filter(arguments__contains={currency_argument: currency})
    count, total = 0, Decimal("0")
    for amount in calls.values_list(f"arguments__{amount_argument}" if amount_argument else "pk", flat=True):
        count += 1
        if amount_argument:
            try:
                total += Decimal(str(amount))
            except (InvalidOperation, ValueError):
                continue
    return total, count
