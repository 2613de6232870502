"""Who may see and do what — the one access policy every surface asks (API, console pages and
socket, the admin desk, the engine's actions).

Everything a user owns hangs off their sessions, so the rule starts there: everyone sees and
acts on what belongs to their own sessions. Operators' extra powers come from permissions, never
from being staff:

  runs_app.view_run               read any run (its steps, events, tool calls, approvals) and the
                                  session it belongs to (a run's steps already show its history)
  runs_app.change_run             cancel any run (and so read it)
  runs_app.exceed_budget_caps     start runs with budgets above the configured caps
  runs_app.follow_all_events      follow the events of every run one may see in one stream (GET
                                  /events/stream: an integrator's key), not only a session's
  sessions_app.view_session       read any session (its history and pending input), not its runs
  approvals_app.decide_approval   see and decide operator-level approvals, never in one's own session
  tools_app.reconcile_toolcall    see and resolve tool calls whose outcome is unknown, never in one's
                                  own session
  agents.change_agent             define agents and give them new versions (admin and API)
  approvals_app.export_ledger     export the tamper-evident ledger (GET /ledger): every session's
                                  decisions and write outcomes

Four eyes (WARDEN_FOUR_EYES, on by default) applies to every human decision an operator makes:
nobody approves, or records the outcome of, a write they are a party to (SPEC §18) — one requested
in their own session, or in a run they started, retried or forked (or that retries or forks one of
theirs), or whose request they edited.

Inactive and anonymous users may do nothing. The admin is the operators' desk: Django admits
only active staff to it, and inside it asks this module like every other surface.
"""

from django.conf import settings
from django.db.models import Q, QuerySet
from django.db.models.lookups import Exact

from approvals_app.models import Approval, ApprovalDecision, ApprovalPolicy, ApprovalStatus
from approvals_app.selectors import delegation_in_force, delegators_in_force
from runs_app.models import Run, RunStatus
from runs_app.selectors import run_session_owner
from sessions_app.models import Session
from tools_app.models import ToolCall, ToolCallStatus

VIEW_ANY_RUN = "runs_app.view_run"
CANCEL_ANY_RUN = "runs_app.change_run"
EXCEED_BUDGET_CAPS = "runs_app.exceed_budget_caps"
FOLLOW_ALL_EVENTS = "runs_app.follow_all_events"
VIEW_ANY_SESSION = "sessions_app.view_session"
DECIDE_OPERATOR_APPROVALS = "approvals_app.decide_approval"
RECONCILE_TOOL_CALLS = "tools_app.reconcile_toolcall"
ARM_DEMO_FAULTS = "demo.change_simfault"
MANAGE_AGENTS = "agents.change_agent"
MANAGE_MODEL_ENDPOINTS = "runs_app.change_modelendpoint"
VIEW_MODEL_ENDPOINTS = "runs_app.view_modelendpoint"
MANAGE_MCP_SERVERS = "tools_app.change_mcpserver"
FREEZE_MONEY = "approvals_app.freeze_money"
EXPORT_LEDGER = "approvals_app.export_ledger"


def runs_by_owner(user) -> bool:
    """Whether the runs `user` sees are only their own (runs_app.selectors.run_list reads those
    from the owner's index)."""
    return not reads_any_run(user)


def is_active(user) -> bool:
    return user is not None and user.is_authenticated and user.is_active


def operator_powers(user) -> dict[str, bool]:
    """What the caller's permissions add to their own sessions (GET /me, the console's header)."""
    return {
        "view_any_run": reads_any_run(user),
        "cancel_any_run": is_active(user) and user.has_perm(CANCEL_ANY_RUN),
        "view_any_session": reads_any_session(user),
        "decide_operator_approvals": is_active(user) and user.has_perm(DECIDE_OPERATOR_APPROVALS),
        "reconcile_tool_calls": is_active(user) and user.has_perm(RECONCILE_TOOL_CALLS),
        "manage_agents": can_manage_agents(user=user),
    }


def _owns(user, session_owner_id) -> bool:
    return is_active(user) and session_owner_id == user.pk


# --- sessions ----------------------------------------------------------------------------------


def reads_any_session(user) -> bool:
    return is_active(user) and (user.has_perm(VIEW_ANY_SESSION) or reads_any_run(user))


def visible_sessions(*, user) -> QuerySet[Session]:
    if not is_active(user):
        return Session.objects.none()
    if reads_any_session(user):
        return Session.objects.all()
    return Session.objects.filter(owner_id=user.pk)


def can_see_session(*, user, session: Session) -> bool:
    return _owns(user, session.owner_id) or reads_any_session(user)


def can_post_in_session(*, user, session: Session) -> bool:
    """Only the session's owner speaks in it; operators read, they never talk as the customer."""
    return _owns(user, session.owner_id)


def reads_desk_notes(*, user, session_owner_id) -> bool:
    """Operators' notes on their decisions and the evidence of a reconciliation are for the desk
    (and the audit trail): the session's customer gets the customer's view, which names no
    operator's words but those meant for them (Approval.customer_message). Whoever else may see
    the session's runs is an operator."""
    return is_active(user) and user.pk != session_owner_id


# --- runs --------------------------------------------------------------------------------------


def reads_any_run(user) -> bool:
    return is_active(user) and (user.has_perm(VIEW_ANY_RUN) or user.has_perm(CANCEL_ANY_RUN))


def visible_runs(*, user) -> QuerySet[Run]:
    if not is_active(user):
        return Run.objects.none()
    if reads_any_run(user):
        return Run.objects.all()
    return Run.objects.filter(Exact(run_session_owner(), user.pk))


def visible_run_parts(*, user, parts: QuerySet) -> QuerySet:
    """Rows that belong to a run (its steps, its events) as its run is visible — joined through the
    run's session, since `visible_runs`' copied-owner column cannot be named inside a subquery (the
    desk's step and event lists were 500s for staff without view_run; issue 27, finding 7)."""
    if not is_active(user):
        return parts.none()
    if reads_any_run(user):
        return parts
    return parts.filter(run__session__owner_id=user.pk)


def can_see_run(*, user, run: Run) -> bool:
    return _owns(user, run.session.owner_id) or reads_any_run(user)


def can_see_runs_of(*, user, session: Session) -> bool:
    """Run visibility within a session is all or nothing: its owner's, or an operator's who reads any run."""
    return _owns(user, session.owner_id) or reads_any_run(user)


def may_exceed_budget_caps(user) -> bool:
    """May ask for budgets above the deployment's caps (WARDEN_MODEL_CALLS_CAP and the others)."""
    return is_active(user) and user.has_perm(EXCEED_BUDGET_CAPS)


def can_follow_all_events(*, user) -> bool:
    """May follow every run they may see in one stream (GET /events): which runs those are is
    still `visible_runs`' answer — the permission adds the stream, not the runs."""
    return is_active(user) and user.has_perm(FOLLOW_ALL_EVENTS)


def cancels_any_run(user) -> bool:
    return is_active(user) and user.has_perm(CANCEL_ANY_RUN)


def can_cancel_run(*, user, run: Run, even_if_ended: bool = False) -> bool:
    """The session's owner, or an operator with change_run; only while the run is active
    (`even_if_ended`: whether they could, had it not ended — a refusal is then a conflict)."""
    if run.is_terminal and not even_if_ended:
        return False
    return _owns(user, run.session.owner_id) or cancels_any_run(user)


def can_retry_run(*, user, run: Run) -> bool:
    """Who may cancel a run may try it again once it failed or was cancelled."""
    return run.status in (RunStatus.FAILED, RunStatus.CANCELLED) and can_cancel_run(user=user, run=run, even_if_ended=True)


def can_fork_run(*, user, run: Run) -> bool:
    """Who may cancel a run may fork it once it has ended (engine.actions.runs.run_fork)."""
    return run.is_terminal and can_cancel_run(user=user, run=run, even_if_ended=True)


# --- approvals ---------------------------------------------------------------------------------


def visible_approvals(*, user) -> QuerySet[Approval]:
    """The approvals of the user's own runs; with decide_approval every operator-level one;
    with the run read permission all of them."""
    if not is_active(user):
        return Approval.objects.none()
    if reads_any_run(user):
        return Approval.objects.all()
    visible = Q(run__session__owner_id=user.pk)
    if user.has_perm(DECIDE_OPERATOR_APPROVALS):
        visible |= Q(policy=ApprovalPolicy.OPERATOR)
    return Approval.objects.filter(visible)


def can_see_approval(*, user, approval: Approval) -> bool:
    if _owns(user, approval.run.session.owner_id) or reads_any_run(user):
        return True
    return is_active(user) and approval.policy == ApprovalPolicy.OPERATOR and user.has_perm(DECIDE_OPERATOR_APPROVALS)


def decidable_approvals(*, user) -> Q:
    """The query form of `can_decide_approval`: a queue page holds only what the caller may decide."""
    if not is_active(user):
        return Q(pk__in=[])
    mine = Q(run__session__owner_id=user.pk)
    decidable = Q(policy=ApprovalPolicy.USER) & mine
    if user.has_perm(DECIDE_OPERATOR_APPROVALS):
        operator = Q(policy=ApprovalPolicy.OPERATOR)
        quorum = Q(required_approvals__gt=1)
        # Never a quorum in one's own session, nor one the caller already approved.
        parties = mine | Q(run_id__in=_runs_caused_by(user)) | Q(editors__contains=[user.pk])
        operator &= ~parties if settings.WARDEN_FOUR_EYES else ~(quorum & parties)
        operator &= ~(quorum & Q(pk__in=ApprovalDecision.objects.filter(
            Q(decided_by_id=user.pk) | Q(on_behalf_of_id=user.pk), voided_at__isnull=True).values("approval_id")))
        decidable |= operator
    return Q(status=ApprovalStatus.PENDING) & decidable


def party_to(*, user, run: Run, approval: Approval | None = None, editors: bool = True) -> str:
    """How `user` caused a write of `run` (SPEC §18), in words for the desk ("you retried this run");
    "" when they did not. The parties are whoever started the run, and whoever started each run it
    retries or forks, back along the line; with `editors`, whoever edited `approval`'s request. (The
    session's owner is the caller's own check.)"""
    current = run
    while current is not None:
        if current.created_by_id == user.pk:
            verb = "retried" if current.retry_of_id else "forked" if current.forked_from_id else "started"
            return f"you {verb} {'this run' if current.pk == run.pk else 'a run this one continues'}"
        parent_id = current.retry_of_id or current.forked_from_id
        current = Run.objects.only("id", "created_by_id", "retry_of_id", "forked_from_id").get(pk=parent_id) if parent_id else None
    if editors and approval is not None and user.pk in approval.editors:
        return "you edited this request"
    return ""


def _runs_caused_by(user) -> set:
    """The runs `user` is a party to through starting one (query form of `party_to`): the runs they
    started in other people's sessions, and every run that retries or forks one of those."""
    caused = set(Run.objects.filter(created_by_id=user.pk).exclude(session__owner_id=user.pk).values_list("id", flat=True))
    frontier = caused
    while frontier:
        frontier = set(Run.objects.filter(Q(retry_of_id__in=frontier) | Q(forked_from_id__in=frontier))
                       .values_list("id", flat=True)) - caused
        caused |= frontier
    return caused


def why_not_a_decider(*, user, approval: Approval, on_behalf_of=None) -> str:
    """'' when `user` is someone who may decide `approval` (whatever its status now) — in their own
    right, or with `on_behalf_of`, standing in for that person under an active delegation
    (`_why_not_a_stand_in`); otherwise the reason, in words for the desk."""
    if on_behalf_of is not None:
        return _why_not_a_stand_in(user=user, approval=approval, principal=on_behalf_of)
    if not is_active(user):
        return "Sign in with an active account to decide."
    owner_id = approval.run.session.owner_id
    if approval.policy == ApprovalPolicy.USER:
        return "" if user.pk == owner_id else "Only the customer whose session this is can confirm it."
    if not user.has_perm(DECIDE_OPERATOR_APPROVALS):
        return NO_DECIDE_PERMISSION
    # A quorum is of people other than the write's parties, whatever WARDEN_FOUR_EYES says.
    if settings.WARDEN_FOUR_EYES or approval.required_approvals > 1:
        if user.pk == owner_id:
            return "Four eyes: you may not decide a request raised in your own session."
        if how := party_to(user=user, run=approval.run, approval=approval):
            return f"Four eyes: {how}, so you are a party to this write and may not decide it."
    if has_approved(user=user, approval=approval):
        return ALREADY_APPROVED
    return ""


NO_DECIDE_PERMISSION = "Deciding needs the approvals_app.decide_approval permission."
ALREADY_APPROVED = "You have already approved this request; it needs another operator's approval."
EDITOR_REFUSAL = "Four eyes: you edited this request, so you are a party to this write and may not decide it."


def _why_not_a_stand_in(*, user, approval: Approval, principal) -> str:
    """'' when `user` may decide `approval` in `principal`'s name: a delegation from `principal` to
    `user` is in force now, `principal` may decide it, and `user` is no party to it either —
    delegation never lets anyone decide their own session's write, whatever WARDEN_FOUR_EYES says,
    and a person counts once in a quorum whether they decided or someone decided for them."""
    if not is_active(user):
        return "Sign in with an active account to decide."
    name = principal.get_username()
    if not delegation_in_force(delegator_id=principal.pk, delegate_id=user.pk):
        return f"You do not stand in for {name} now: no delegation from them to you is in force."
    if approval.policy == ApprovalPolicy.USER:
        return "A customer's confirmation is theirs alone: nobody confirms it in their name."
    if user.pk == approval.run.session.owner_id:
        return f"Standing in for {name} does not let you decide a request raised in your own session."
    if how := party_to(user=user, run=approval.run, approval=approval):
        return f"Standing in for {name} does not change that {how}: you are a party to this write."
    if has_approved(user=user, approval=approval) or has_approved(user=principal, approval=approval):
        return (f"{name} has already approved this request, in person or through a stand-in; they count once."
                if has_approved(user=principal, approval=approval) else ALREADY_APPROVED)
    if not is_active(principal):
        return f"{name}'s account is inactive: nobody decides in their name."
    if refusal := why_not_a_decider(user=principal, approval=approval):
        return f"{name} may not decide it, so neither may their stand-in: {refusal}"
    return ""


def stand_in_for(*, user, approval: Approval):
    """Whom `user` may decide `approval` for when they may not in their own right for want of the
    permission only: the first delegator (earliest delegation) whose stand-in they may be; None."""
    if why_not_a_decider(user=user, approval=approval) != NO_DECIDE_PERMISSION:
        return None
    for principal in delegators_in_force(delegate_id=user.pk):
        if _why_not_a_stand_in(user=user, approval=approval, principal=principal) == "":
            return principal
    return None


def has_approved(*, user, approval: Approval) -> bool:
    """Whether `user` is one of a quorum approval's approvers already — in person or through a
    stand-in (a refusal that is a conflict — their decision is in — not a lack of permission)."""
    return approval.required_approvals > 1 and approval.decisions.filter(
        Q(decided_by_id=user.pk) | Q(on_behalf_of_id=user.pk), voided_at__isnull=True).exists()


def why_not_an_editor(*, user, approval: Approval) -> str:
    """'' when `user` may change the arguments of the write `approval` holds before it is decided
    (SPEC §18): an operator who may decide it — having approved it already does not bar an edit
    (the edit voids every approval so far). A customer's confirmation is theirs to give or
    refuse as asked, never edited."""
    if approval.policy == ApprovalPolicy.USER:
        return "A customer's confirmation cannot be edited: the customer confirms or declines what was asked."
    refusal = why_not_a_decider(user=user, approval=approval)
    # Who edited it may edit it again (and still may not decide it); having approved does not bar an edit.
    return "" if refusal in (ALREADY_APPROVED, EDITOR_REFUSAL) else refusal


def can_edit_approval(*, user, approval: Approval) -> bool:
    return approval.status == ApprovalStatus.PENDING and why_not_an_editor(user=user, approval=approval) == ""


def why_cannot_decide(*, user, approval: Approval) -> str:
    """'' when `user` may decide `approval` now; otherwise the reason."""
    if approval.status != ApprovalStatus.PENDING:
        return f"Already {approval.status}."
    return why_not_a_decider(user=user, approval=approval)


def can_decide_approval(*, user, approval: Approval) -> bool:
    return why_cannot_decide(user=user, approval=approval) == ""


# --- tool calls --------------------------------------------------------------------------------


def visible_tool_calls(*, user) -> QuerySet[ToolCall]:
    """The calls of the user's own runs; with the reconcile permission also every unknown (or
    reconciled) call — the operators' queue; with the run read permission all of them."""
    if not is_active(user):
        return ToolCall.objects.none()
    if reads_any_run(user):
        return ToolCall.objects.all()
    visible = Q(run__session__owner_id=user.pk)
    if user.has_perm(RECONCILE_TOOL_CALLS):
        visible |= Q(status=ToolCallStatus.UNKNOWN) | ~Q(resolution="")
    return ToolCall.objects.filter(visible)


def can_see_tool_call(*, user, tool_call: ToolCall) -> bool:
    if _owns(user, tool_call.run.session.owner_id) or reads_any_run(user):
        return True
    return can_reconcile(user=user) and (tool_call.status == ToolCallStatus.UNKNOWN or tool_call.resolution != "")


def can_freeze(*, user) -> bool:
    """May freeze and unfreeze an agent's, a tool's or a customer's money movement (SPEC §18)."""
    return is_active(user) and user.has_perm(FREEZE_MONEY)


def can_export_ledger(*, user) -> bool:
    """May read the whole tamper-evident ledger (docs/LEDGER.md): every decision and write outcome
    of every session — an auditor's or a SIEM's key, not a customer's."""
    return is_active(user) and user.has_perm(EXPORT_LEDGER)


def can_reconcile(*, user) -> bool:
    """May work the unknown-calls queue at all (ask downstream again, record outcomes)."""
    return is_active(user) and user.has_perm(RECONCILE_TOOL_CALLS)


def why_not_a_reconciler(*, user, tool_call: ToolCall) -> str:
    """'' when `user` is someone who may reconcile `tool_call` (whatever its status now) — ask the
    downstream system on their behalf, or record its outcome; otherwise the reason, in words for the desk."""
    if not can_reconcile(user=user):
        return "Reconciling needs the tools_app.reconcile_toolcall permission."
    if settings.WARDEN_FOUR_EYES and user.pk == tool_call.run.session.owner_id:
        return "Four eyes: you may not reconcile a tool call made in your own session."
    if settings.WARDEN_FOUR_EYES:
        # Only an edited call has editors to ask its approval about (no query per row otherwise).
        approval = (Approval.objects.filter(tool_call_id=tool_call.pk).first()
                    if tool_call.proposed_arguments is not None else None)
        if how := party_to(user=user, run=tool_call.run, approval=approval):
            return f"Four eyes: {how}, so you are a party to this write and may not record its outcome."
    return ""


def why_cannot_reconcile(*, user, tool_call: ToolCall) -> str:
    """'' when `user` may reconcile `tool_call` now; otherwise the reason."""
    if refusal := why_not_a_reconciler(user=user, tool_call=tool_call):
        return refusal
    if tool_call.status != ToolCallStatus.UNKNOWN:
        return f"This tool call is {tool_call.status}, not unknown; nothing to reconcile."
    return ""


def can_reconcile_tool_call(*, user, tool_call: ToolCall) -> bool:
    return why_cannot_reconcile(user=user, tool_call=tool_call) == ""


# --- agents ------------------------------------------------------------------------------------


def can_manage_agents(*, user) -> bool:
    """May define agents and save new versions of them (the admin's agent pages, POST/PUT /agents)."""
    return is_active(user) and user.has_perm(MANAGE_AGENTS)


def can_manage_mcp_servers(*, user) -> bool:
    """May define MCP servers, set or rotate their credentials and check their tools (the desk's MCP servers)."""
    return is_active(user) and user.has_perm(MANAGE_MCP_SERVERS)


def can_manage_model_endpoints(*, user) -> bool:
    """May define model endpoints and set or rotate their credentials (the desk's Model endpoints)."""
    return is_active(user) and user.has_perm(MANAGE_MODEL_ENDPOINTS)


def can_see_model_endpoints(*, user) -> bool:
    """May read the model endpoints (never a credential: nobody may) — to name one in an agent."""
    return is_active(user) and (user.has_perm(VIEW_MODEL_ENDPOINTS) or user.has_perm(MANAGE_MODEL_ENDPOINTS)
                                or user.has_perm(MANAGE_AGENTS))


def can_see_agents(*, user) -> bool:
    """Everyone signed in may list the agents (to pick one for a new session) and read their
    current definition: instructions, tools and rules are what the run will be held to."""
    return is_active(user)


# --- the demo world ----------------------------------------------------------------------------


def can_arm_demo_faults(*, user) -> bool:
    """May press the desk's demo buttons that arm the simulated gateway's faults (demo mode only;
    the desk checks settings.WARDEN_DEMO): staff with the demo app's change_simfault permission."""
    return is_active(user) and user.is_staff and user.has_perm(ARM_DEMO_FAULTS)
