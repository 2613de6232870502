"""Reads about runs: the filtered list and its event log, of the runs a caller may see (the access
policy's queryset, given by the caller), what ends a run's wait, and the model endpoints."""

import re
from dataclasses import dataclass
from datetime import datetime

from django.db.models import BooleanField, F, IntegerField, Q, QuerySet
from django.db.models.expressions import RawSQL

from config.pagination import keyset_page
from runs_app.models import (
    DEADLINE_PAUSED_WAITS, RUNNING_PHASES, TERMINAL_STATUSES, ModelEndpoint, Run, RunEvent, RunPhase, RunStatus, Step, WaitReason,
)

# The list shows the run's state, not its checkpoint: narrower rows, faster pages.
RUN_LIST_FIELDS = (
    "id", "session_id", "status", "phase", "wait_reason", "outcome", "model_calls", "tokens_used", "cancel_requested_at",
    "error_code", "created_at", "finished_at",
)
# What a list item says besides the run's own columns (issue 28: which agent, about what), by name.
RUN_LIST_JOINED = {"title": "session__title", "agent": "agent_version__agent__slug"}
RECENT_EVENTS = 50


def run_session_owner() -> RawSQL:
    """The session's owner copied onto the run by a trigger (runs_app migration 0006): owner-scoped
    pages filter and order by it, so they are range scans of run_owner_recent, not a walk over
    every run."""
    return RawSQL('"runs_app_run"."session_owner_id"', [], output_field=IntegerField())


def run_session_owner_in(owner_ids: list[int]) -> Q:
    """Runs of these users' sessions, through the copied owner column (its index)."""
    return Q(RawSQL('"runs_app_run"."session_owner_id" = ANY(%s)', [list(owner_ids)], output_field=BooleanField()))


# Which clock ends each kind of wait (SPEC §16), for the console, the desk and the API.
WAIT_CLOCKS = {
    WaitReason.APPROVAL: ("approval_expiry", "the approval request expires"),
    WaitReason.WAITING_INPUT: ("question_expiry", "the question expires unanswered"),
    WaitReason.RETRY_BACKOFF: ("backoff", "the backoff ends and the model is asked again"),
    WaitReason.RECONCILIATION: ("reconciliation", "the write's outcome is known; no clock ends this wait"),
    WaitReason.FROZEN: ("freeze", "an operator lifts the freeze; no clock ends this wait"),
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
    ends_at = None if run.wait_reason in (WaitReason.RECONCILIATION, WaitReason.FROZEN) else run.expires_at
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
    runs: QuerySet[Run],
    by_owner: bool,
    statuses: list[str] | None = None,
    phase: str | None = None,
    wait_reason: str | None = None,
    outcomes: list[str] | None = None,
    session_id=None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    cursor: str | None = None,
    limit: int,
    columns: dict | None = None,
) -> tuple[list[dict], str | None]:
    """Newest first with keyset pagination on (created_at, id); one query per page. `runs` is what
    the caller may see (access.visible_runs); `by_owner` says it is one customer's runs, so the page
    is read from the owner's index; `columns` are expressions of the apps above, by name, read in the
    same query. Rows are dicts: at a page of 200 building model instances costs more than the query."""
    queryset = runs.values(*RUN_LIST_FIELDS, **{name: F(path) for name, path in RUN_LIST_JOINED.items()}, **(columns or {}))
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
    if by_owner:
        order_prefix.append(run_session_owner())
    if wanted is not None and len(wanted) == 1:
        order_prefix.append("status")
    elif outcomes and len(set(outcomes)) == 1 and not by_owner:
        order_prefix.append("outcome")  # the run_outcome_recent index yields the page in order
    return keyset_page(queryset, cursor=cursor, limit=limit, position_field="created_at", order_prefix=tuple(order_prefix))


def run_get(*, runs: QuerySet[Run], run_id) -> Run | None:
    """One run of `runs` (what the caller may see: access.visible_runs), with who did what to it."""
    return runs.select_related("session__owner", "created_by", "cancel_requested_by", "budgets_set_by").filter(pk=run_id).first()


def run_steps(*, run_id) -> list[Step]:
    return list(Step.objects.filter(run_id=run_id).order_by("index"))


def run_recent_events(*, run_id, limit: int = RECENT_EVENTS) -> list[RunEvent]:
    """The latest `limit` events, oldest first."""
    return list(reversed(RunEvent.objects.filter(run_id=run_id).order_by("-seq")[:limit]))


def run_event_list(*, run_id, after_seq: int = 0, limit: int) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run_id, seq__gt=after_seq).order_by("seq")[:limit])


def run_event_poll(*, run_id, after_seq: int, limit: int) -> tuple[list[RunEvent], str, bool]:
    """Events after `after_seq`, the run's status, and whether the stream is over: the run is
    terminal and nothing after them remains. The run is read first: its event_seq then bounds every
    event committed with the status we saw."""
    status, last_seq = Run.objects.filter(pk=run_id).values_list("status", "event_seq").get()
    events = run_event_list(run_id=run_id, after_seq=after_seq, limit=limit)
    reached = events[-1].seq if events else after_seq
    return events, status, status in TERMINAL_STATUSES and reached >= last_seq


# A model endpoint's name as ModelEndpoint.name (a SlugField) allows it: anything else names none.
ENDPOINT_NAME = re.compile(r"[-a-zA-Z0-9_]{1,64}")


def endpoint_list() -> list[ModelEndpoint]:
    """Every model endpoint, by name, with the models it offers (never opening a credential)."""
    return list(ModelEndpoint.objects.prefetch_related("offered_models").order_by("name"))


def endpoint_get(*, name: str) -> ModelEndpoint | None:
    if not ENDPOINT_NAME.fullmatch(name or ""):
        return None
    return ModelEndpoint.objects.prefetch_related("offered_models").filter(name=name).first()
