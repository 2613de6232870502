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
import time

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, transaction
from django.utils import timezone

from runs_app.engine import model_step, tool_exec
from runs_app.engine.faults import fault_point
from runs_app.engine.lease import Heartbeat, Lease, run_claim, worker_identity
from runs_app.engine.state import Checkpoint, RunFailure, StopDriving, checkpoint_load
from runs_app.models import Run, RunErrorCode, RunStatus
from runs_app.services import run_transition
from runs_app.transitions import LeaseLost
from tools_app.models import ToolCallStatus

logger = logging.getLogger("warden.engine")


def run_drive(*, run_id: str) -> str:
    """Entry point of a worker task. Returns a short word for the task log."""
    close_old_connections()
    lease = run_claim(run_id=run_id, owner=worker_identity())
    if lease is None:
        return "not-claimable"
    fault_point("after_claim")
    heartbeat = Heartbeat(lease)
    heartbeat.start()
    driver = Driver(lease, heartbeat)
    try:
        return driver.drive()
    except LeaseLost:
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
        heartbeat.stop()


class Driver:
    def __init__(self, lease: Lease, heartbeat: Heartbeat):
        self.lease = lease
        self.heartbeat = heartbeat
        self.slice_ends = time.monotonic() + settings.WARDEN_SLICE_SECONDS

    def drive(self) -> str:
        while True:
            if self.heartbeat.lease_lost.is_set():
                raise LeaseLost(f"run {self.lease.run_id}: heartbeat found the lease gone")
            cp = checkpoint_load(run_id=self.lease.run_id, lease=self.lease)
            if cp.run.status != RunStatus.RUNNING:
                return cp.run.status
            try:
                outcome = self.advance(cp)
            except StopDriving as stop:
                return stop.outcome
            except RunFailure as failure:
                return self.fail(cp.run, failure.code, failure.detail)
            if outcome:
                return outcome
            if time.monotonic() >= self.slice_ends:
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
            from runs_app.engine.cancel import run_cancel_by_worker

            return run_cancel_by_worker(cp=cp, lease=self.lease)
        if timezone.now() >= run.deadline:
            raise RunFailure(RunErrorCode.DEADLINE, f"the run passed its deadline {run.deadline.isoformat()}")
        if cp.open_tool_calls:
            return tool_exec.tools_advance(cp=cp, lease=self.lease, heartbeat=self.heartbeat)
        latest = cp.latest_step
        if latest is not None and latest.kind == "model" and latest.status == "running" and latest.lease_token != self.lease.token:
            # Opened by a worker that is gone: whatever it had received is discarded (SPEC §10).
            model_step.model_step_discard(cp=cp, lease=self.lease, reason="worker lost mid-stream; output discarded")
            return None
        if cp.answered:
            return self.complete(run)
        return model_step.model_turn(cp=cp, lease=self.lease, heartbeat=self.heartbeat)

    def complete(self, run: Run) -> str:
        from sessions_app.services import session_lock, session_start_next_run

        with transaction.atomic():
            session_lock(session_id=run.session_id)
            run_transition(run=run, to=RunStatus.COMPLETED, lease_token=self.lease.token)
            session_start_next_run(session_id=run.session_id)
        return "completed"

    def fail(self, run: Run, code: str, detail: str) -> str:
        """End the run as failed, closing what never started — unless a write is in doubt (a bug
        struck mid-write, say): then the write is recovered and the run waits for its
        reconciliation; the failure, if it recurs, comes after."""
        from runs_app.engine.cancel import run_close_unstarted, writes_in_doubt
        from sessions_app.services import session_lock, session_start_next_run

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
        with transaction.atomic():
            session_lock(session_id=run.session_id)
            run_close_unstarted(run=run, lease_token=self.lease.token, code="run_failed", why="the run failed")
            run_transition(
                run=run, to=RunStatus.FAILED, lease_token=self.lease.token, error_code=code, error_detail=detail[:2000]
            )
            session_start_next_run(session_id=run.session_id)
        return "failed"

    def yield_slice(self, run: Run) -> str:
        """Time slice used: hand the run back to the queue so other runs get workers too.

        The commit that finishes a tool round opens the next model step (one commit per step),
        counting its model call. Yielding right after it, the model was never called: that step
        is discarded here and its call given back, so the next worker's call is the only one
        counted (otherwise every such yield would cost a call of the run's budget)."""
        from django.db.models import F

        from runs_app.models import Step, StepKind, StepStatus
        from runs_app.tasks import run_enqueue

        with transaction.atomic():
            extra = []
            latest = Step.objects.filter(run_id=run.id).order_by("-index").first()
            if (latest is not None and latest.kind == StepKind.MODEL and latest.status == StepStatus.RUNNING
                    and latest.lease_token == self.lease.token and not latest.streamed_text):
                reason = "time slice used before the model was called"
                Step.objects.filter(pk=latest.pk).update(status=StepStatus.DISCARDED, discard_reason=reason,
                                                         finished_at=timezone.now())
                extra.append(("step_discarded", {"step": latest.index, "reason": reason, "previous_lease_token": latest.lease_token}))
            if not run_transition(run=run, to=RunStatus.QUEUED, lease_token=self.lease.token,
                                  event_payload={"reason": "time slice used"}, extra_events=extra):
                return "yielded"
            if extra:
                Run.objects.filter(pk=run.id).update(model_calls=F("model_calls") - 1)
            run_enqueue(run.id)
        return "yielded"
