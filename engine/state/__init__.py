"""The state module: the one place that writes a run's state — every fenced statement on runs,
steps and tool calls (DBOS's SystemDatabase, at our scale). Orchestration calls it; nothing else
writes those tables' status, phase or wait reason, nor builds a `run_status` event.

    runs.py       run_write (counters, budgets, events; never the state shape), the named changes —
                  run_transition, run_phase_enter, run_cancel_request — run_create, the run-row lock,
                  what the lease holder has seen, the checkpoint's read
    leases.py     the claim, the heartbeat's renewal, the sweeper's revocation
    steps.py      step and tool-call transitions, step_discard, a turn's calls inserted, an approval
                  closed and logged on its run
    inputs.py     pending input resolved and consumed
    fast.py       the hot path: the same named changes, composed into one statement per step
"""

from engine.state.fast import Carried, model_step_opened, reads_finished, turn_answered, turn_with_reads
from engine.state.inputs import input_consume, input_resolve
from engine.state.leases import (
    Lease,
    Renewal,
    lease_renew,
    lease_renew_many,
    lease_revoke_expired,
    run_claim,
    runs_cancel_requested,
    steps_streamed_text_save,
)
from engine.state.runs import (
    RUN_STATE_FIELDS,
    RunWrite,
    require_transaction,
    run_and_latest_step,
    run_cancel_request,
    run_create,
    run_ending_outcome,
    run_event_append,
    run_lease_holder_forget,
    run_phase_enter,
    run_phase_values,
    run_row_lock,
    run_seen_by_lease_holder,
    run_status_event,
    run_touched_by_others,
    run_transition,
    run_transition_values,
    run_write,
    run_written_by_lease_holder,
)
from engine.state.steps import (
    approval_close,
    business_keys_lock,
    freeze_gate,
    step_create,
    step_discard,
    step_transition,
    step_transition_values,
    tool_call_transition,
    tool_call_transition_values,
    tool_calls_insert,
    tool_calls_start,
)

__all__ = [
    "Carried", "Lease", "RUN_STATE_FIELDS", "Renewal", "RunWrite", "approval_close", "business_keys_lock", "freeze_gate",
    "input_consume", "input_resolve", "lease_renew", "lease_renew_many", "lease_revoke_expired", "model_step_opened", "reads_finished", "require_transaction",
    "run_and_latest_step", "run_cancel_request", "run_claim", "run_create", "run_ending_outcome", "run_event_append",
    "run_lease_holder_forget", "run_phase_enter", "run_phase_values", "run_row_lock", "run_seen_by_lease_holder",
    "run_status_event", "run_touched_by_others", "run_transition", "run_transition_values", "run_write",
    "run_written_by_lease_holder", "runs_cancel_requested", "step_create", "step_discard", "step_transition",
    "step_transition_values", "steps_streamed_text_save", "tool_call_transition", "tool_call_transition_values", "tool_calls_insert",
    "tool_calls_start", "turn_answered", "turn_with_reads",
]
