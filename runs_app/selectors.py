"""Reads about runs: the filtered list, the detail with everything an integrator or operator
needs to judge a run, and its event log — scoped to what a user may see."""

import functools
import re
import uuid
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.contrib.auth import get_user_model

from approvals_app.models import Approval
from config.pagination import keyset_page
from runs_app.models import (
    DEADLINE_PAUSED_WAITS, RUNNING_PHASES, Agent, AgentVersion, Run, RunEvent, RunPhase, RunStatus, Step, WaitReason,
)
from sessions_app import access
from tools_app.models import ToolCall
from sessions_app.models import Session
from tools_app.selectors import applied_effects, tool_calls_matching

# The list shows the run's state, not its checkpoint: narrower rows, faster pages.
RUN_LIST_FIELDS = (
    "id", "session_id", "status", "phase", "wait_reason", "outcome", "model_calls", "tokens_used", "cancel_requested_at",
    "error_code", "created_at", "finished_at",
)
RECENT_EVENTS = 50
# A desk search stops collecting matches here: it narrows a list, it is not an export.
SEARCH_LIMIT = 2000


# Which clock ends each kind of wait (SPEC §16), for the console, the desk and the API.
WAIT_CLOCKS = {
    WaitReason.APPROVAL: ("approval_expiry", "the approval request expires"),
    WaitReason.WAITING_INPUT: ("question_expiry", "the question expires unanswered"),
    WaitReason.RETRY_BACKOFF: ("backoff", "the backoff ends and the model is asked again"),
    WaitReason.RECONCILIATION: ("reconciliation", "the write's outcome is known; no clock ends this wait"),
}


@dataclass(frozen=True)
class WaitClock:
    clock: str
    ends_at: datetime | None
    meaning: str
    deadline_paused: bool


def run_wait_clock(run: Run) -> WaitClock | None:
    """What ends a waiting run's wait, and when; whether the run's own deadline is paused meanwhile."""
    if run.status != RunStatus.WAITING or not run.wait_reason:
        return None
    clock, meaning = WAIT_CLOCKS[run.wait_reason]
    ends_at = None if run.wait_reason == WaitReason.RECONCILIATION else run.expires_at
    return WaitClock(clock=clock, ends_at=ends_at, meaning=meaning, deadline_paused=run.wait_reason in DEADLINE_PAUSED_WAITS)


def _implied_statuses(*, phase: str | None, wait_reason: str | None) -> set[str] | None:
    # A wait reason only exists on waiting runs and a phase only on queued/running ones; saying
    # so lets PostgreSQL use the (status, created_at) index instead of scanning every run.
    if wait_reason:
        return {RunStatus.WAITING}
    if phase == RunPhase.WAITING_WORKER:
        return {RunStatus.QUEUED}
    if phase in RUNNING_PHASES:
        return {RunStatus.RUNNING}
    return None


def run_list(
    *,
    user,
    statuses: list[str] | None = None,
    phase: str | None = None,
    wait_reason: str | None = None,
    outcomes: list[str] | None = None,
    session_id=None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    cursor: str | None = None,
    limit: int,
) -> tuple[list[dict], str | None]:
    """Newest first with keyset pagination on (created_at, id); one query per page. Rows are
    dicts: at a page of 200 building model instances costs more than the query."""
    queryset = access.visible_runs(user=user).values(*RUN_LIST_FIELDS)
    wanted = set(statuses) if statuses else None
    implied = _implied_statuses(phase=phase, wait_reason=wait_reason)
    if implied is not None:
        wanted = implied if wanted is None else wanted & implied
    if wanted is not None:
        if not wanted:
            return [], None
        queryset = queryset.filter(status__in=sorted(wanted))
    if phase:
        queryset = queryset.filter(phase=phase)
    if wait_reason:
        queryset = queryset.filter(wait_reason=wait_reason)
    if outcomes:
        queryset = queryset.filter(outcome__in=sorted(set(outcomes)))
    if session_id:
        queryset = queryset.filter(session_id=session_id)
    if created_after:
        queryset = queryset.filter(created_at__gte=created_after)
    if created_before:
        queryset = queryset.filter(created_at__lt=created_before)
    order_prefix = []
    if not access.reads_any_run(user):
        order_prefix.append(access.run_session_owner())
    if wanted is not None and len(wanted) == 1:
        order_prefix.append("status")
    elif outcomes and len(set(outcomes)) == 1 and access.reads_any_run(user):
        order_prefix.append("outcome")  # the run_outcome_recent index yields the page in order
    return keyset_page(queryset, cursor=cursor, limit=limit, position_field="created_at", order_prefix=tuple(order_prefix))


def run_get(*, user, run_id) -> Run | None:
    return access.visible_runs(user=user).select_related("session__owner", "created_by", "cancel_requested_by", "budgets_set_by").filter(pk=run_id).first()


@dataclass(frozen=True)
class RunDetail:
    run: Run
    steps: list[Step]
    tool_calls: list[ToolCall]
    approvals: list[Approval]
    applied_effects: list[dict]
    recent_events: list[RunEvent]


def run_detail(*, run: Run) -> RunDetail:
    """Everything about one run, in a fixed number of queries."""
    recent = RunEvent.objects.filter(run_id=run.pk).order_by("-seq")[:RECENT_EVENTS]
    return RunDetail(
        run=run,
        steps=list(Step.objects.filter(run_id=run.pk).order_by("index")),
        tool_calls=list(
            ToolCall.objects.filter(run_id=run.pk).select_related("resolved_by", "approval", "step", "run__session")
            .order_by("step__index", "index")
        ),
        approvals=list(
            Approval.objects.filter(run_id=run.pk).select_related("decided_by", "tool_call", "run__session").order_by("requested_at")
        ),
        applied_effects=applied_effects(run_id=run.pk),
        recent_events=list(reversed(recent)),
    )


def run_event_list(*, run_id, after_seq: int = 0, limit: int) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run_id, seq__gt=after_seq).order_by("seq")[:limit])


def run_event_poll(*, run_id, after_seq: int, limit: int) -> tuple[list[RunEvent], str, bool]:
    """Events after `after_seq`, the run's status, and whether the stream is over: the run is
    terminal and nothing after them remains. The run is read first: its event_seq then bounds every
    event committed with the status we saw."""
    status, last_seq = Run.objects.filter(pk=run_id).values_list("status", "event_seq").get()
    events = run_event_list(run_id=run_id, after_seq=after_seq, limit=limit)
    reached = events[-1].seq if events else after_seq
    return events, status, status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED) and reached >= last_seq


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
        add(Run.objects.filter(access.run_session_owner_in(owners)).order_by("-created_at").values_list("pk", flat=True)[:limit])
    sessions = Session.objects.filter(title__icontains=term).order_by().values("pk")[:limit]
    # Unordered: ordered by time, PostgreSQL would walk every run newest first looking for these.
    add(Run.objects.filter(session_id__in=sessions).order_by().values_list("pk", flat=True)[:limit])
    return list(found)


# --- agents ----------------------------------------------------------------------------------------

AGENT_SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")

@functools.lru_cache(maxsize=512)
def agent_version_get(version_id: int) -> AgentVersion:
    """A version by id, kept per process: versions never change (the database refuses it), and a
    worker reads its run's on every model call and tool call."""
    return AgentVersion.objects.select_related("agent").get(pk=version_id)


def run_agent_version(run: Run) -> AgentVersion | None:
    return agent_version_get(run.agent_version_id) if run.agent_version_id else None


def run_offered_tools(run: Run) -> list[str] | None:
    """The tools the run's model may see and call (its agent version's, besides ask_user); None:
    a run without an agent version, which is offered every registered tool."""
    version = run_agent_version(run)
    return list(version.tools) if version is not None else None


def agent_list(*, user) -> list[Agent]:
    if not access.can_see_agents(user=user):
        return []
    return list(Agent.objects.select_related("current_version").filter(current_version__isnull=False).order_by("name", "id"))


def agent_get(*, user, slug: str) -> Agent | None:
    if not access.can_see_agents(user=user) or not AGENT_SLUG.fullmatch(slug or ""):
        return None
    return Agent.objects.select_related("current_version").filter(slug=slug, current_version__isnull=False).first()


def agent_default() -> Agent | None:
    """The agent new sessions get when they name none (settings.WARDEN_DEFAULT_AGENT), if it exists."""
    slug = settings.WARDEN_DEFAULT_AGENT
    return Agent.objects.filter(slug=slug, current_version__isnull=False).first() if slug else None
