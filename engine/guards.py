"""What the guards that see more than one call (SPEC §18) share between creating a turn's writes
(engine.tool_exec) and an operator's edit of a pending one (engine.actions.approvals): the keys a
write is known by, what the agent's limits say of it, and the stricter of a rule and a limit."""

from dataclasses import dataclass
from decimal import Decimal

from agents.definitions import RuleMatch, approval_requirement
from agents.limits import TIER_ORDER, limit_scopes, limit_verdict
from agents.selectors import run_agent_version
from engine import state
from runs_app.models import Run
from sessions_app.selectors import session_customer
from tools_app.models import ToolCall
from tools_app.registry import ApprovalRequirement, Tool
from tools_app.selectors import writes_spent

# A retried run's write that its predecessor did not apply gets ":retry<n>" after its key.
RETRY_KEY_MARK = ":retry"


def key_base(key: str) -> str:
    return key.split(RETRY_KEY_MARK, 1)[0]


def retried_runs(run: Run) -> list[Run]:
    """The runs this one retries, newest first (its parent, the parent's parent, …)."""
    lineage, parent_id = [], run.retry_of_id
    while parent_id is not None:
        parent = Run.objects.only("id", "retry_of_id").get(pk=parent_id)
        lineage.append(parent)
        parent_id = parent.retry_of_id
    return lineage


def run_scoped_key(tool: Tool, validated, *, run: Run, lineage: list[Run]) -> str:
    """The key of a write without a business key: a hash of the first run of its retry line, the tool
    and the arguments — with ":retry<n>" in a retry (`lineage`: the runs it retries, newest first),
    so a write its predecessors never applied is sent under a key of its own."""
    base = tool.idempotency_key_for(run_id=lineage[-1].pk if lineage else run.id, arguments=validated)
    return f"{base}{RETRY_KEY_MARK}{len(lineage)}" if lineage else base


def scope_spent(tool: Tool, scope, since, *, exclude_pk=None) -> tuple[Decimal, int]:
    """What a limit's scope holds in its window before a call (tools_app.selectors.writes_spent)."""
    return writes_spent(tool_name=tool.name, since=since, per=scope.per, value=scope.value, amount_argument=tool.amount,
                        currency_argument=tool.currency_argument, currency=scope.currency, exclude_pk=exclude_pk)


def with_limits(requirement: RuleMatch, guard: dict | None, tool_name: str) -> RuleMatch:
    """The stricter of the agent's approval rule and what its limits asked for."""
    if not guard or not guard.get("over"):
        return requirement
    tier, approvers = guard["approval"], guard["approvers"]
    stricter = (TIER_ORDER[tier], approvers) > (TIER_ORDER[requirement.approval], requirement.approvers)
    why = "over a limit: " + "; ".join(guard["over"])
    if not stricter:
        return RuleMatch(approval=requirement.approval, approvers=requirement.approvers, rule=requirement.rule,
                         reason=f"{requirement.reason}; {why}"[:500])
    who = {ApprovalRequirement.USER: "the session's user"}.get(tier, "an operator")
    rule = f"{tool_name}: over a limit → {who if approvers == 1 else f'{approvers} distinct operators'}"
    return RuleMatch(approval=tier, approvers=approvers, rule=rule[:300], reason=why[:500])


@dataclass(frozen=True)
class Recheck:
    """An edited write as the guards see it: its keys, its limits' verdict (`refused`: why not),
    and who must approve it."""

    business_key: str | None
    idempotency_key: str | None
    guard: dict | None
    refused: str
    requirement: RuleMatch


def write_recheck(*, run: Run, call: ToolCall, tool: Tool, arguments: dict, validated) -> Recheck:
    """Re-evaluate a pending write as if the model had asked for `arguments` (the caller's
    transaction holds the session's lock): its business key or per-run key recomputed, the
    agent's limits (each scope locked; the call itself not counted twice) and the agent's rules.
    The caps on writes per turn and per run do not change: it is still one write."""
    business_key, refused = tool.business_key_for(validated), ""
    if business_key is not None and business_key != call.business_key:
        state.business_keys_lock([business_key])  # before the limits' locks, as a turn takes them
        holder = ToolCall.objects.filter(business_key=business_key).exclude(pk=call.pk).order_by("created_at").first()
        if holder is not None:
            refused = (f"another request already holds the business key {business_key} (tool call {holder.id} of run "
                       f"{holder.run_id}, {holder.status}); one business fact is booked once")
        idempotency_key = business_key
    elif business_key is not None:
        idempotency_key = call.idempotency_key
    else:
        idempotency_key = run_scoped_key(tool, validated, run=run, lineage=retried_runs(run))
    version = run_agent_version(run)
    limits = ((version.limits or {}) if version is not None else {}).get(tool.name)
    guard = call.guard
    if limits and not refused:
        scopes = limit_scopes(tool=tool, limits=limits, arguments=arguments,
                              customer_id=session_customer(str(run.session_id)).id,
                              agent_id=version.agent_id)
        state.business_keys_lock([scope.lock_key() for scope in scopes])
        guard = limit_verdict(tool=tool, limits=limits, scopes=scopes, arguments=arguments,
                              spent=lambda scope, since: scope_spent(tool, scope, since, exclude_pk=call.pk)).guard(tool)
        refused = guard["refused"]["detail"] if "refused" in guard else ""
    requirement = with_limits(approval_requirement(version=version, tool=tool, arguments=arguments), guard, tool.name)
    return Recheck(business_key=business_key, idempotency_key=idempotency_key, guard=guard, refused=refused,
                   requirement=requirement)
