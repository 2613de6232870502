"""Driving runs in the test's own process, as worker tasks do — for the behaviour of a run, which
needs no real worker process (those are for what only processes show: kill -9, takeover, two
clusters racing, lock order under bursts).

Each slice is `engine.loop.run_drive`, a worker task's entry point, so the run goes through the
claim, the fence and every commit a worker makes. Between slices the sweeper's pass runs (it wakes
backoffs, expires what is due, resumes what a decision unblocked), as the sweeper process would.
Needs a transactional test database (the engine commits) and, for the demo tools, the simulator."""

import time

from engine.loop import run_drive
from engine.sweeper import sweep_once
from runs_app.models import TERMINAL_STATUSES, Run, RunStatus

# A bound on a stuck test, never an assertion about speed.
TIMEOUT_SECONDS = 60


def drive_until(run, status: str, wait_reason: str = "", *, timeout: float = TIMEOUT_SECONDS) -> Run:
    """Drive `run` (a Run or its id) until it is `status` (with `wait_reason`, for a waiting run);
    returns the run as stored then. A waiting run is left to the sweeper's passes — a backoff ends,
    a question or an approval expires, a reconciliation settles — so a run that waits for a person
    the test never plays fails at `timeout`; one that ended otherwise fails at once."""
    run_id = getattr(run, "pk", run)
    deadline = time.monotonic() + timeout
    while True:
        current = Run.objects.get(pk=run_id)
        if (current.status, current.wait_reason) == (status, wait_reason):
            return current
        if current.status in TERMINAL_STATUSES:
            raise AssertionError(f"run {run_id} ended {current.status} ({current.error_code} {current.error_detail}), "
                                 f"not {status}/{wait_reason}")
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} did not get to {status}/{wait_reason}: it is "
                                 f"{current.status}/{current.wait_reason}")
        if current.status == RunStatus.QUEUED:
            run_drive(run_id=str(run_id))
        else:  # waiting (or, briefly, a lease the sweeper must revoke): the sweeper's pass, when due
            time.sleep(0.05)
            sweep_once()


def drive_to_end(run, *, timeout: float = TIMEOUT_SECONDS) -> Run:
    """Drive `run` until it ended, whichever way (completed, failed or cancelled); returns it."""
    run_id = getattr(run, "pk", run)
    deadline = time.monotonic() + timeout
    while (current := Run.objects.get(pk=run_id)).status not in TERMINAL_STATUSES:
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} did not end: it is {current.status}/{current.wait_reason}")
        if current.status == RunStatus.QUEUED:
            run_drive(run_id=str(run_id))
        else:
            time.sleep(0.05)
            sweep_once()
    return current
