"""The worker loop: drive one run under a fenced lease until it suspends, ends, or its time
slice is used (SPEC §2–§6, §10, §11).

Each pass reads the checkpoint and does the next thing it calls for, so a fresh run, a resumed
one and one taken over from a dead worker all go through the same code:
  open tool calls in the latest tools step → execute them (or wait for approval/reconciliation)
  latest model step still `running`        → a half-received response: discard, ask again
  latest model step answered without tools → the run is complete
  otherwise                                → safe point (pending input), then call the model
Every step boundary is one transaction fenced by the lease token; each commit both finishes
one thing and starts the next, so a model step and a read tool call cost one commit each.
"""

import logging
import threading
import time

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, transaction
from django.utils import timezone

from agents.selectors import run_tools_scope
from config.logs import log_context
from config.tracing import span, span_set
from engine import model_step, tool_exec
from engine.actions.cancel import run_cancel_by_worker
from engine.actions.runs import run_end
from engine.checkpoint import Checkpoint, CheckpointStale, RunFailure, StopDriving, checkpoint_load
from engine.faults import fault_point
from engine.lease import RunBeat, lease_keeper, worker_identity
from engine.queue import run_enqueue
from engine.state import Lease, run_claim, run_lease_holder_forget, run_transition, step_discard
from operations import liveness
from runs_app.models import Run, RunErrorCode, RunStatus, Step, StepKind, StepStatus
from runs_app.providers.interrupt import interruptible
from runs_app.transitions import LeaseLost
from tools_app.models import ToolCallStatus
from tools_app.selectors import writes_in_doubt

logger = logging.getLogger("warden.engine")

# Set when the process is about to end (django-q2 recycles or stops it): every run it drives
# yields at its next step instead of using the rest of its slice.
_stopping = threading.Event()


def drive_stop_soon() -> None:
    _stopping.set()


def run_drive(*, run_id: str) -> str:
    """Entry point of a worker task. Returns a short word for the task log (and the
    `warden_worker_tasks_total` metric)."""
    close_old_connections()
    owner = worker_identity()
    with log_context(run_id=str(run_id), worker=owner):
        lease = run_claim(run_id=run_id, owner=owner)
        if lease is None:
            liveness.count("tasks:not-claimable")
            return "not-claimable"
        with log_context(session_id=lease.session_id, lease_token=lease.token), \
                span("run.slice", run_id=run_id, session_id=lease.session_id, lease_token=lease.token, worker=owner) as current:
            outcome = _drive_claimed(lease)
            span_set(current, outcome=outcome)
            logger.info("run %s: time slice ended: %s", run_id, outcome, extra={"outcome": outcome})
        liveness.count(f"tasks:{outcome}")
        return outcome


def _drive_claimed(lease: Lease) -> str:
    run_id = lease.run_id
    fault_point("after_claim")
    keeper = lease_keeper()
    beat = keeper.hold(lease)
    driver = Driver(lease, beat)
    try:
        with interruptible(beat.interrupt), run_tools_scope(lease.run or Run.objects.only("agent_version_id").get(pk=run_id)):
            return driver.drive()
    except LeaseLost:
        # A fenced write matched no row (or the heartbeat found the token gone first): another
        # worker holds the run now, so this one stops without writing anything.
        liveness.count("fenced_writes_refused")
        logger.warning("run %s: lease %s lost; stopping without further writes", run_id, lease.token)
        return "lease-lost"
    except (OperationalError, InterfaceError):
        # The database went away (restart, terminated connection): nothing half-written was
        # committed; the lease expires and the sweeper hands the run to a worker again.
        logger.warning("run %s: database error; leaving the run for takeover", run_id, exc_info=True)
        close_old_connections()
        return "database-error"
    except Exception as error:
        # A bug must not become a crash loop: fail the run, fenced, with the error on record.
        logger.exception("run %s: unexpected error", run_id)
        close_old_connections()
        try:
            return driver.fail(Run.objects.get(pk=run_id), RunErrorCode.INTERNAL, f"{type(error).__name__}: {error}")
        except LeaseLost:
            return "lease-lost"
    finally:
        keeper.release(beat)
        run_lease_holder_forget(run_id=run_id)


class Driver:
    def __init__(self, lease: Lease, heartbeat: RunBeat):
        self.lease = lease
        self.heartbeat = heartbeat
        self.slice_ends = time.monotonic() + settings.WARDEN_SLICE_SECONDS

    def drive(self) -> str:
        carried: Checkpoint | None = None
        claimed = self.lease.run  # the first pass starts from the run as the claim left it
        while True:
            if self.heartbeat.lease_lost.is_set():
                raise LeaseLost(f"run {self.lease.run_id}: heartbeat found the lease gone")
            # After a one-statement step commit the worker knows the checkpoint it leads to
            # (engine/state/fast.py); after anything else it reads it again.
            cp = carried or checkpoint_load(run_id=self.lease.run_id, lease=self.lease, run=claimed)
            carried = claimed = None
            if cp.run.status != RunStatus.RUNNING:
                return cp.run.status
            try:
                outcome = self.advance(cp)
            except CheckpointStale:
                continue
            except StopDriving as stop:
                return stop.outcome
            except RunFailure as failure:
                return self.fail(cp.run, failure.code, failure.detail)
            carried = cp.carried
            if outcome:
                return outcome
            if time.monotonic() >= self.slice_ends or _stopping.is_set():
                return self.yield_slice(cp.run)

    def advance(self, cp: Checkpoint) -> str | None:
        run = cp.run
        # A write in doubt comes before everything, cancel and deadline included: no run ends
        # while a write may have reached the payment service unrecorded (SPEC §9, §10).
        interrupted = [c for c in cp.open_tool_calls if c.status == ToolCallStatus.RUNNING and c.lease_token != self.lease.token]
        if interrupted:
            for call in interrupted:
                tool_exec.recover_interrupted(run=run, lease=self.lease, call=call)
            return None
        unknown = next((c for c in cp.open_tool_calls if c.status == ToolCallStatus.UNKNOWN), None)
        if unknown is not None:
            tool_exec.wait_for_reconciliation(run=run, lease=self.lease, call=unknown)  # raises StopDriving
        if run.cancel_requested_at is not None or self.heartbeat.cancel_requested.is_set():
            return run_cancel_by_worker(run=run, lease_token=self.lease.token)
        if timezone.now() >= run.deadline:
            raise RunFailure(RunErrorCode.DEADLINE, f"the run passed its deadline {run.deadline.isoformat()}")
        if cp.open_tool_calls:
            return tool_exec.tools_advance(cp=cp, lease=self.lease, heartbeat=self.heartbeat)
        latest = cp.latest_step
        if (latest is not None and latest.kind == StepKind.MODEL and latest.status == StepStatus.RUNNING
                and latest.lease_token != self.lease.token):
            # Opened by a worker that is gone: whatever it had received is discarded (SPEC §10).
            model_step.model_step_discard(cp=cp, lease=self.lease, reason="worker lost mid-stream; output discarded")
            return None
        if cp.answered:
            return self.complete(run)
        return model_step.model_turn(cp=cp, lease=self.lease, heartbeat=self.heartbeat)

    def complete(self, run: Run) -> str:
        run_end(run=run, to=RunStatus.COMPLETED, lease_token=self.lease.token)
        return "completed"

    def fail(self, run: Run, code: str, detail: str) -> str:
        """End the run as failed, closing what never started — unless a write is in doubt (a bug
        struck mid-write, say): then the write is recovered and the run waits for its
        reconciliation; the failure, if it recurs, comes after."""
        run = Run.objects.get(pk=run.pk)
        doubt = list(writes_in_doubt(run_id=run.id))
        if doubt:
            logger.error("run %s: not failed (%s: %s) while write %s is in doubt; reconciling it first",
                         run.id, code, detail, doubt[0].id)
            for call in doubt:
                if call.status == ToolCallStatus.RUNNING:
                    tool_exec.recover_interrupted(run=run, lease=self.lease, call=call)
            tool_exec.wait_for_reconciliation(run=run, lease=self.lease, call=doubt[0], raise_stop=False)
            return "reconciliation"
        run_end(run=run, to=RunStatus.FAILED, lease_token=self.lease.token, error_code=code, error_detail=detail)
        return "failed"

    def yield_slice(self, run: Run) -> str:
        """Time slice used: hand the run back to the queue so other runs get workers too.

        The commit that finishes a tool round opens the next model step (one commit per step),
        counting its model call. Yielding right after it, the model was never called: that step
        is discarded here and its call given back, so the next worker's call is the only one
        counted (otherwise every such yield would cost a call of the run's budget)."""
        with transaction.atomic():
            extra_events, changes = [], {}
            latest = Step.objects.filter(run_id=run.id).order_by("-index").first()
            if (latest is not None and latest.kind == StepKind.MODEL and latest.status == StepStatus.RUNNING
                    and latest.lease_token == self.lease.token and not latest.streamed_text):
                extra_events.append(step_discard(step=latest, reason="time slice used before the model was called",
                                                 lease_token=self.lease.token))
                changes["model_calls"] = run.model_calls - 1
            if not run_transition(run=run, to=RunStatus.QUEUED, lease_token=self.lease.token,
                                  event_payload={"reason": "time slice used"}, extra_events=extra_events, **changes):
                return "yielded"
            run_enqueue(run.id)
        return "yielded"
