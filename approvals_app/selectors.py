"""Reads for the operators' desk: what an approver needs to see, and the overview of everything
waiting for a human."""

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from django.db import connection
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from approvals_app.models import (
    Approval, ApprovalPolicy, ApprovalStatus, AuditEntry, Delegation, Freeze, FreezeScope, SavedView,
)
from config.pagination import keyset_page
from runs_app.models import ACTIVE_STATUSES, TERMINAL_STATUSES, Run, RunOutcome, RunStatus, WaitReason
from sessions_app.models import Message, MessageRole
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect

CONVERSATION_MESSAGES = 20


def approval_conversation(*, approval: Approval, limit: int = CONVERSATION_MESSAGES) -> list[Message]:
    """The latest messages of the session the request came from, oldest first."""
    latest = Message.objects.filter(session_id=approval.run.session_id).order_by("-seq")[:limit]
    return list(reversed(latest))


def approval_read_results(*, approval: Approval) -> list[ToolCall]:
    """What the run's read tools found (e.g. query_order's answer): the facts the model based
    its request on, shown beside it so the approver can check them."""
    return list(
        ToolCall.objects.filter(run_id=approval.run_id, effect=ToolEffect.READ, status=ToolCallStatus.SUCCEEDED)
        .order_by("created_at", "index")
    )


def approval_same_key_calls(*, approval: Approval, limit: int = 20) -> list[ToolCall]:
    """The other calls that asked for the same business fact as the approval's call — in any run
    or session, oldest first — so the approver sees whether it was already done (SPEC §18)."""
    key = approval.tool_call.business_key
    if not key:
        return []
    return list(ToolCall.objects.filter(business_key=key).exclude(pk=approval.tool_call_id).order_by("created_at")[:limit])


@dataclass(frozen=True)
class WaitingItem:
    kind: str  # "approval" or "unknown tool call"
    pk: object
    label: str
    since: datetime


@dataclass(frozen=True)
class DeskOverview:
    pending_approvals: int
    unknown_calls: int
    runs_by_status: dict[str, int]  # active runs: all of them; ended runs: those created in the last day
    runs_by_wait_reason: dict[str, int]
    oldest_waiting: WaitingItem | None
    since: datetime  # where the ended runs' window starts


# The dashboard counts ended runs over this window (active runs whatever their age): a count
# of every run ever is a scan of the whole table, and yesterday's is what an operator acts on.
OVERVIEW_WINDOW = timedelta(hours=24)


def desk_overview(*, now: datetime | None = None) -> DeskOverview:
    """The numbers on the dashboard: what waits for an operator, the active runs, and how the
    runs of the last day ended. Each count is a range of an index."""
    now = now or timezone.now()
    since = now - OVERVIEW_WINDOW
    pending = Approval.objects.filter(status=ApprovalStatus.PENDING)
    unknown = ToolCall.objects.filter(status=ToolCallStatus.UNKNOWN)
    by_status = dict.fromkeys(RunStatus.values, 0)
    by_status |= dict(Run.objects.filter(status__in=ACTIVE_STATUSES).order_by().values_list("status").annotate(n=Count("pk")))
    by_status |= dict(
        Run.objects.filter(status__in=TERMINAL_STATUSES, created_at__gte=since).order_by().values_list("status").annotate(n=Count("pk"))
    )
    by_wait_reason = dict.fromkeys(WaitReason.values, 0)
    by_wait_reason |= dict(
        Run.objects.filter(status=RunStatus.WAITING).order_by().values_list("wait_reason").annotate(n=Count("pk"))
    )
    candidates = []
    oldest_approval = pending.select_related("tool_call").order_by("requested_at").first()
    if oldest_approval is not None:
        candidates.append(
            WaitingItem("approval", oldest_approval.pk, f"approval of {oldest_approval.tool_call.tool_name}", oldest_approval.requested_at)
        )
    # An unknown call has waited since its outcome became unknown (finished_at is set then).
    oldest_unknown = unknown.order_by("finished_at", "created_at").first()
    if oldest_unknown is not None:
        candidates.append(
            WaitingItem(
                "unknown tool call", oldest_unknown.pk, f"unknown outcome of {oldest_unknown.tool_name}",
                oldest_unknown.finished_at or oldest_unknown.created_at,
            )
        )
    return DeskOverview(
        pending_approvals=pending.count(),
        unknown_calls=unknown.count(),
        runs_by_status=by_status,
        runs_by_wait_reason=by_wait_reason,
        oldest_waiting=min(candidates, key=lambda item: item.since, default=None),
        since=since,
    )


# The dashboard's charts: hours of the last day, days of the last fortnight.
CHART_HOURS = 24
CHART_DAYS = 14
CHART_UNKNOWN_CALLS = 12


@dataclass(frozen=True)
class DeskCharts:
    hours: list[datetime]
    runs_per_hour: list[dict[str, int]]  # per hour: outcome (or "active") → runs created then
    duration_per_hour: list[dict[str, float]]  # per hour: p50, p95 seconds of the runs created then that ended
    days: list[date]
    approval_wait_per_day: list[dict[str, float]]  # per day: p50, p95 seconds from request to decision, n
    tokens_per_day: list[dict[str, int]]  # per day: tokens, runs
    unknown_calls: list[ToolCall]  # the oldest unknown calls, oldest first


def _rows(sql: str, params: list) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def desk_charts(*, now: datetime | None = None) -> DeskCharts:
    """What the dashboard draws: each series one aggregate over an index range of its window."""
    now = now or timezone.now()
    this_hour = now.replace(minute=0, second=0, microsecond=0)
    hours = [this_hour - timedelta(hours=n) for n in range(CHART_HOURS - 1, -1, -1)]
    today = timezone.localdate(now)
    days = [today - timedelta(days=n) for n in range(CHART_DAYS - 1, -1, -1)]
    day_start = timezone.make_aware(datetime.combine(days[0], time.min))

    per_hour = {hour: {} for hour in hours}
    for hour, outcome, count in _rows(
        "SELECT date_trunc('hour', created_at), CASE WHEN status IN ('queued', 'running', 'waiting') THEN 'active' "
        "ELSE coalesce(nullif(outcome, ''), 'none') END, count(*) FROM runs_app_run WHERE created_at >= %s GROUP BY 1, 2",
        [hours[0]],
    ):
        if hour in per_hour:
            per_hour[hour][outcome] = count
    durations = {hour: {} for hour in hours}
    for hour, p50, p95 in _rows(
        "SELECT date_trunc('hour', created_at), "
        "percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at)), "
        "percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at)) "
        "FROM runs_app_run WHERE created_at >= %s AND finished_at IS NOT NULL GROUP BY 1",
        [hours[0]],
    ):
        if hour in durations:
            durations[hour] = {"p50": float(p50), "p95": float(p95)}
    waits = {day: {} for day in days}
    for day, p50, p95, count in _rows(
        "SELECT (date_trunc('day', requested_at))::date, "
        "percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM decided_at - requested_at)), "
        "percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM decided_at - requested_at)), count(*) "
        "FROM approvals_app_approval WHERE requested_at >= %s AND status IN ('approved', 'rejected') GROUP BY 1",
        [day_start],
    ):
        if day in waits:
            waits[day] = {"p50": float(p50), "p95": float(p95), "n": count}
    tokens = {day: {"tokens": 0, "runs": 0} for day in days}
    for day, used, count in _rows(
        "SELECT (date_trunc('day', created_at))::date, sum(tokens_used), count(*) FROM runs_app_run "
        "WHERE created_at >= %s GROUP BY 1",
        [day_start],
    ):
        if day in tokens:
            tokens[day] = {"tokens": int(used or 0), "runs": count}
    unknown = list(
        ToolCall.objects.filter(status=ToolCallStatus.UNKNOWN).select_related("run__session__owner")
        .order_by("finished_at", "created_at")[:CHART_UNKNOWN_CALLS]
    )
    return DeskCharts(
        hours=hours,
        runs_per_hour=[per_hour[hour] for hour in hours],
        duration_per_hour=[durations[hour] for hour in hours],
        days=days,
        approval_wait_per_day=[waits[day] for day in days],
        tokens_per_day=[tokens[day] for day in days],
        unknown_calls=unknown,
    )


def audit_recent(*, limit: int = 10) -> list[AuditEntry]:
    """The latest human decisions, for the dashboard's "Recent decisions" (every surface's, not
    only the admin's own log)."""
    return list(AuditEntry.objects.select_related("actor").order_by("-created_at", "-id")[:limit])


# ---------------------------------------------------------------------------
# Pages of the approvals a caller may see (the access policy's querysets, given by the caller).
# ---------------------------------------------------------------------------


def approval_list(
    *, approvals: QuerySet[Approval], statuses: list[str] | None = None, decidable: Q | None = None, run_id=None,
    cursor: str | None = None, limit: int
) -> tuple[list[Approval], str | None]:
    """Oldest request first (the queue order), keyset-paginated, one query per page; of `approvals`
    (access.visible_approvals), and of those the caller may decide when `decidable`
    (access.decidable_approvals) is given."""
    queryset = approvals.select_related("run__session", "tool_call", "decided_by")
    if statuses:
        queryset = queryset.filter(status__in=statuses)
    if decidable is not None:
        queryset = queryset.filter(decidable)
    if run_id:
        queryset = queryset.filter(run_id=run_id)
    return keyset_page(queryset, cursor=cursor, limit=limit, position_field="requested_at", descending=False)


def approval_get(*, approvals: QuerySet[Approval], approval_id) -> Approval | None:
    return approvals.select_related("run__session", "tool_call", "decided_by").filter(pk=approval_id).first()


def approvals_of_run(*, run_id) -> list[Approval]:
    return list(Approval.objects.filter(run_id=run_id).select_related("decided_by", "tool_call", "run__session")
                .order_by("requested_at"))


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


def freeze_active(*, tool_name: str, agent_slug: str, customer_username: str) -> Freeze | None:
    """The freeze that stops this write, if any (a refusing one before a waiting one)."""
    scopes = Q(scope=FreezeScope.TOOL, target=tool_name) | Q(scope=FreezeScope.CUSTOMER, target=customer_username)
    if agent_slug:
        scopes |= Q(scope=FreezeScope.AGENT, target=agent_slug)
    return Freeze.objects.filter(scopes, lifted_at__isnull=True).order_by("mode").first()  # "refuse" < "wait"


def freezes_in_force() -> list[Freeze]:
    return list(Freeze.objects.filter(lifted_at__isnull=True).select_related("created_by").order_by("-created_at"))


def delegations_in_force(*, at: datetime | None = None) -> QuerySet[Delegation]:
    """Delegations in force at `at` (now): begun, not ended, not revoked."""
    at = at or timezone.now()
    return Delegation.objects.filter(starts_at__lte=at, ends_at__gt=at, revoked_at__isnull=True)


def delegation_in_force(*, delegator_id, delegate_id, at: datetime | None = None) -> bool:
    return delegations_in_force(at=at).filter(delegator_id=delegator_id, delegate_id=delegate_id).exists()


def delegators_in_force(*, delegate_id, at: datetime | None = None) -> list:
    """The people `delegate_id` stands in for now, earliest delegation first."""
    return [d.delegator for d in delegations_in_force(at=at).filter(delegate_id=delegate_id)
            .select_related("delegator").order_by("starts_at", "id")]


# The queue's tiers and waiting bands (issue 29): the dashboard counts by them and the queue filters
# by them, from these same predicates, so a number and the list it links to always agree.
APPROVAL_TIERS: dict[str, tuple[str, Q]] = {
    "user": ("customer's confirmation", Q(policy=ApprovalPolicy.USER)),
    "operator": ("one operator", Q(policy=ApprovalPolicy.OPERATOR, required_approvals=1)),
    "quorum": ("a quorum of operators", Q(required_approvals__gt=1)),
}
WAIT_BAND_EDGES = (timedelta(minutes=10), timedelta(hours=1))
WAIT_BANDS: dict[str, str] = {"lt10m": "under 10 min", "10m-1h": "10–60 min", "gt1h": "over 1 h"}


def approval_wait_band(*, band: str, now: datetime) -> Q:
    """The requests that have waited for `band` (a key of WAIT_BANDS) at `now`."""
    short, long = (now - edge for edge in WAIT_BAND_EDGES)
    return {"lt10m": Q(requested_at__gt=short), "10m-1h": Q(requested_at__lte=short, requested_at__gt=long),
            "gt1h": Q(requested_at__lte=long)}[band]


@dataclass(frozen=True)
class PendingCounts:
    by_tier: dict[str, int]  # key of APPROVAL_TIERS → pending requests
    by_wait: dict[str, int]  # key of WAIT_BANDS → pending requests
    mine: int  # pending, assigned to the caller
    unassigned: int
    now: datetime  # when they were counted: the queue's bands move with the clock


def approval_pending_counts(*, approvals: QuerySet[Approval], user, now: datetime | None = None) -> PendingCounts:
    """The pending requests among `approvals` (what the access policy lets the caller see) by tier,
    by how long they have waited, and by who has them in hand — one aggregate over the pending index."""
    now = now or timezone.now()
    aggregates = {f"tier_{key}": Count("pk", filter=where) for key, (_, where) in APPROVAL_TIERS.items()}
    aggregates |= {f"wait_{key}": Count("pk", filter=approval_wait_band(band=key, now=now)) for key in WAIT_BANDS}
    aggregates |= {"mine": Count("pk", filter=Q(assigned_to_id=user.pk)),
                   "unassigned": Count("pk", filter=Q(assigned_to__isnull=True))}
    row = approvals.filter(status=ApprovalStatus.PENDING).order_by().aggregate(**aggregates)
    return PendingCounts(by_tier={key: row[f"tier_{key}"] for key in APPROVAL_TIERS},
                         by_wait={key: row[f"wait_{key}"] for key in WAIT_BANDS},
                         mine=row["mine"], unassigned=row["unassigned"], now=now)


def saved_view_list(*, owner) -> list[SavedView]:
    """An operator's own saved views, by name; nobody sees another's."""
    return list(SavedView.objects.filter(owner=owner).order_by("name"))


# ---------------------------------------------------------------------------
# What a decision about one write needs beside it (the approve, reject and record-outcome pages).
# ---------------------------------------------------------------------------

CUSTOMER_REQUEST_MESSAGES = 5


def call_customer_request(*, tool_call: ToolCall, limit: int = CUSTOMER_REQUEST_MESSAGES) -> list[Message]:
    """What the customer asked for in the run that made the call: the run's user messages, oldest
    first (the request, then what they added while it ran); for a run without one, the session's
    last user message before the call."""
    asked = list(Message.objects.filter(run_id=tool_call.run_id, role=MessageRole.USER).order_by("seq")[:limit])
    if asked:
        return asked
    before = (Message.objects.filter(session_id=tool_call.run.session_id, role=MessageRole.USER,
                                     created_at__lte=tool_call.created_at).order_by("-seq").first())
    return [before] if before is not None else []


def call_conversation(*, tool_call: ToolCall, limit: int = CONVERSATION_MESSAGES) -> list[Message]:
    """The latest messages of the session the call was made in, oldest first."""
    latest = Message.objects.filter(session_id=tool_call.run.session_id).order_by("-seq")[:limit]
    return list(reversed(latest))


def call_read_results(*, tool_call: ToolCall) -> list[ToolCall]:
    """What the run's read tools found before deciding on its write (approval_read_results, by call)."""
    return list(
        ToolCall.objects.filter(run_id=tool_call.run_id, effect=ToolEffect.READ, status=ToolCallStatus.SUCCEEDED)
        .order_by("created_at", "index")
    )


def call_same_key_calls(*, tool_call: ToolCall, limit: int = 20) -> list[ToolCall]:
    """The other calls that asked for the same business fact, in any run or session, oldest first
    (approval_same_key_calls, by call)."""
    if not tool_call.business_key:
        return []
    return list(ToolCall.objects.filter(business_key=tool_call.business_key).exclude(pk=tool_call.pk)
                .select_related("run").order_by("created_at")[:limit])
