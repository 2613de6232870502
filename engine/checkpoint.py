"""Reading the checkpoint a worker resumes from, and what it says about the run's budgets."""

from dataclasses import dataclass, field
from typing import Any

from engine.state import Carried, Lease, run_and_latest_step
from runs_app.models import Run, RunStatus, Step, StepKind, StepStatus
from runs_app.transitions import LeaseLost
from tools_app.models import ToolCall, ToolCallStatus

OPEN_TOOL_CALL_STATUSES = (ToolCallStatus.PENDING, ToolCallStatus.RUNNING, ToolCallStatus.UNKNOWN)


class RunFailure(Exception):
    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class StopDriving(Exception):
    """The run was suspended or handed over in the middle of a pass; the task ends."""

    def __init__(self, outcome: str):
        super().__init__(outcome)
        self.outcome = outcome


class CheckpointStale(Exception):
    """Something the worker read changed under it (nothing was written): read the checkpoint
    again and carry on from what it says."""


@dataclass
class Checkpoint:
    run: Run
    latest_step: Step | None
    tools_step: Step | None = None
    open_tool_calls: list[ToolCall] = field(default_factory=list)
    # The model context this worker last built, while only its own one-statement commits wrote
    # to the session since (engine/state/fast.py): the next call extends it instead of reading.
    context: Any = None
    # Set by a one-statement step commit: the checkpoint that commit leads to, known without
    # reading it again, since the run's snapshot showed nobody else had written meanwhile.
    carried: "Checkpoint | None" = None

    def carry(self, carried: Carried | None) -> bool:
        """Go on from what a one-statement commit (engine/state/fast.py) led to, when it was taken."""
        if carried is None:
            return False
        self.carried = Checkpoint(run=self.run, latest_step=carried.latest_step, tools_step=carried.tools_step,
                                  open_tool_calls=carried.open_tool_calls, context=carried.context)
        return True

    @property
    def answered(self) -> bool:
        """The latest model step produced a final answer: a completed model step is followed by
        a tools step whenever it asked for tools, so being latest means it did not."""
        step = self.latest_step
        return step is not None and step.kind == StepKind.MODEL and step.status == StepStatus.COMPLETED


def checkpoint_load(*, run_id, lease: Lease, run: Run | None = None) -> Checkpoint:
    """What the worker resumes from: the run (or `run`, as its claim just read it), its latest
    step, and that step's open tool calls."""
    if run is None:
        run, latest = run_and_latest_step(run_id=run_id)
    else:
        # A run's steps are numbered by step_count: a run that counts none has none.
        latest = Step.objects.filter(run_id=run_id).order_by("-index").first() if run.step_count else None
    if run.lease_token != lease.token or (run.status == RunStatus.RUNNING and run.lease_owner != lease.owner):
        raise LeaseLost(f"run {run_id}: token {run.lease_token} is not ours ({lease.token})")
    cp = Checkpoint(run=run, latest_step=latest)
    if latest is not None and latest.kind == StepKind.TOOLS and latest.status == StepStatus.RUNNING:
        cp.tools_step = latest
        cp.open_tool_calls = list(
            ToolCall.objects.filter(step=latest, status__in=OPEN_TOOL_CALL_STATUSES)
            .select_related("reused_from")
            .order_by("index")
        )
    return cp


def model_calls_used(run: Run) -> int:
    """Model calls that count against the budget: every call made, less those a transient error
    cut off (retried under WARDEN_MAX_MODEL_RETRIES instead)."""
    return run.model_calls - run.model_retries


def budget_left(run: Run) -> bool:
    """Whether the run may make another model call."""
    return model_calls_used(run) < run.max_model_calls and run.tokens_used < run.max_tokens
