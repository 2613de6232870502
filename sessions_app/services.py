"""Single-app writes about sessions, their history and pending input. Posting a message, which
may start or steer a run, is the orchestration layer's (engine/actions/messages.py)."""

from django.db import connection
from django.db.models import Subquery
from django.utils import timezone

from config.errors import WardenError
from runs_app.models import Run
from sessions_app.errors import SessionRefusal
from sessions_app.models import InputDisposition, InputMode, Message, PendingInput, Session

# The longest message a user may post (API, console page and socket alike).
MAX_MESSAGE_CHARS = 20_000


def session_create(*, owner, title: str = "", agent=None) -> Session:
    """A session whose runs use `agent` (None: no agent; every registered tool is offered). Opening one
    with the deployment's default agent is engine.actions.sessions.session_open."""
    return Session.objects.create(owner=owner, title=title[:200], agent=agent)


def messages_append(*, session_id, messages: list[Message]) -> list[Message]:
    """Append messages with the next gap-free seqs. The UPDATE locks the session row, so
    concurrent appenders (a worker and a web request) take turns; the caller's transaction
    holds the lock until it commits."""
    if not connection.in_atomic_block:
        raise RuntimeError("messages_append must run inside the caller's transaction")
    if not messages:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            'UPDATE "sessions_app_session" SET "message_seq" = "message_seq" + %s, "updated_at" = now() '
            'WHERE "id" = %s RETURNING "message_seq"',
            [len(messages), session_id],
        )
        (last_seq,) = cursor.fetchone()
    first = last_seq - len(messages) + 1
    for offset, message in enumerate(messages):
        message.session_id = session_id
        message.seq = first + offset
    return Message.objects.bulk_create(messages)


def message_text_checked(*, content: str, mode: str) -> str:
    """The text a user posts, refused before anything is written when it cannot be stored."""
    content = (content or "").strip()
    if not content:
        raise WardenError(SessionRefusal.EMPTY_MESSAGE, "A message needs some text.")
    if len(content) > MAX_MESSAGE_CHARS:
        raise WardenError(SessionRefusal.MESSAGE_TOO_LONG, f"A message may hold at most {MAX_MESSAGE_CHARS} characters.")
    if mode not in InputMode.values:
        raise WardenError(SessionRefusal.INVALID_MODE, f"Unknown mode {mode!r}; use one of {', '.join(InputMode.values)}.")
    return content


def session_lock(*, session_id) -> None:
    """Serialises what decides whether a session has an active run — posting input, a run
    ending (which then starts the next one from pending input) — and every other change of a
    session's runs made outside their worker (decisions, reconciliation, cancel): each takes it
    first, then the run's row, so no two of them ever wait on each other in opposite orders.

    FOR NO KEY UPDATE, not FOR UPDATE: a commit that inserts a row pointing at the session (a
    message, a run), or updates a run twice, takes a KEY SHARE lock on the session row for its
    deferred foreign-key checks, which FOR UPDATE would block — while this transaction waits
    for that one's run row: a deadlock (PITFALLS.md; issue 12, finding 3)."""
    Session.objects.select_for_update(no_key=True).filter(pk=session_id).values_list("pk").get()


def session_lock_of_run(*, run_id) -> None:
    """session_lock on the session of the run `run_id`, in one statement (for a caller that knows
    only the run: the ledger's outcome of a write, approvals_app.ledger)."""
    runs = Run.objects.filter(pk=run_id).values("session_id")
    Session.objects.select_for_update(no_key=True).filter(pk=Subquery(runs)).values_list("pk").get()


# Why an input is held, as the customer reads it (PendingInput.held_reason).
HELD_BECAUSE_CANCELLED = "its run was cancelled"


def pending_inputs_hold(*, pending_ids: list[int], run_id, reason: str = HELD_BECAUSE_CANCELLED) -> int:
    """Take input meant for run `run_id` (which ended without reading it) out of the queue, held
    for the session's user to choose what becomes of it; no run starts from it. The caller holds
    the session's lock. Returns how many were held (input consumed meanwhile is left alone)."""
    return PendingInput.objects.filter(pk__in=pending_ids, consumed_at__isnull=True).update(
        consumed_at=timezone.now(), disposition=InputDisposition.HELD, held_from_id=run_id, held_reason=reason[:200],
    )


def held_input_lock(*, pending_id) -> PendingInput | None:
    """The input, row-locked, while it is still held (None once sent or dropped). The caller
    holds the session's lock first (session_lock)."""
    return PendingInput.objects.select_for_update(no_key=True).filter(pk=pending_id, disposition=InputDisposition.HELD).first()


def held_input_sent(*, pending: PendingInput, run_id=None, message: Message | None = None) -> bool:
    """The user sent the held input as a new request: it started run `run_id` as `message`, or —
    another run being active — was posted again as a queued request (a new pending input, after
    the ones already waiting), and this one is done with."""
    return bool(PendingInput.objects.filter(pk=pending.pk, disposition=InputDisposition.HELD).update(
        consumed_at=timezone.now(), consumed_by_id=run_id, disposition=InputDisposition.NEW_RUN,
        resolved_mode=InputMode.QUEUE, message=message,
    ))


def held_input_drop(*, pending: PendingInput) -> bool:
    """The user dropped the held input: it stays in the session's record as discarded."""
    return bool(PendingInput.objects.filter(pk=pending.pk, disposition=InputDisposition.HELD).update(
        consumed_at=timezone.now(), disposition=InputDisposition.DISCARDED,
    ))
