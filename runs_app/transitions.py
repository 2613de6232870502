"""Allowed run and step transitions, as data (SPEC §2). The database's check constraints back
these tables up; terminal statuses have no way out."""

from config.errors import CommonRefusal, WardenError
from runs_app.models import RunStatus, StepStatus


class IllegalTransition(WardenError):
    """A transition the table does not allow. Nothing was written. Met by a request, it means the
    object changed meanwhile (a conflict)."""

    def __init__(self, kind: str, from_status: str, to_status: str):
        super().__init__(CommonRefusal.CONFLICT,
                         f"The {kind} changed state meanwhile: illegal {kind} transition {from_status} → {to_status}.")
        self.kind = kind
        self.from_status = from_status
        self.to_status = to_status


class LeaseLost(WardenError):
    """The worker no longer holds the run's lease (another worker took over, or the run was
    revoked). The transaction is rolled back; the worker must stop driving the run. Met by a
    request, it means the run changed meanwhile (a conflict)."""

    def __init__(self, detail: str = ""):
        super().__init__(CommonRefusal.CONFLICT, "The run changed meanwhile; read it again and retry.")
        self.detail = detail

    def __str__(self) -> str:
        return self.detail or self.message


S = RunStatus
RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.RUNNING, S.CANCELLED, S.FAILED}),
    # running → running is a phase change; running → queued hands the run back (time slice
    # used, or a lease revoked by the sweeper).
    S.RUNNING: frozenset({S.RUNNING, S.QUEUED, S.WAITING, S.COMPLETED, S.FAILED, S.CANCELLED}),
    S.WAITING: frozenset({S.QUEUED, S.CANCELLED, S.FAILED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}


St = StepStatus
# A step is created `running` (the model call or tool batch it records has begun) and ends once.
STEP_TRANSITIONS: dict[str, frozenset[str]] = {
    St.RUNNING: frozenset({St.COMPLETED, St.DISCARDED, St.FAILED}),
    St.COMPLETED: frozenset(),
    St.DISCARDED: frozenset(),
    St.FAILED: frozenset(),
}


def check_transition(table: dict[str, frozenset[str]], kind: str, from_status: str, to_status: str) -> None:
    if to_status not in table.get(from_status, frozenset()):
        raise IllegalTransition(kind, from_status, to_status)


def sources_of(table: dict[str, frozenset[str]], to_status: str) -> list[str]:
    return [source for source, targets in table.items() if to_status in targets]
