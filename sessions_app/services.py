"""Writes about sessions, messages and pending input."""

from dataclasses import dataclass

from django.db import connection, transaction

from runs_app.models import ACTIVE_STATUSES, Run, RunStatus
from sessions_app.models import InputDisposition, InputMode, Message, MessageRole, PendingInput, Session

# The longest message a user may post (API, console page and socket alike).
MAX_MESSAGE_CHARS = 20_000


class SessionError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def session_create(*, owner, title: str = "") -> Session:
    return Session.objects.create(owner=owner, title=title[:200])


def messages_append(*, session_id, messages: list[Message]) -> list[Message]:
    """Append messages with the next gap-free seqs. The UPDATE locks the session row, so
    concurrent appenders (a worker and a web request) take turns; the caller's transaction
    holds the lock until it commits."""
    assert connection.in_atomic_block, "messages_append must run inside the caller's transaction"
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


@dataclass
class PostResult:
    disposition: str  # "started_run" or "pending"
    run: Run
    message: Message | None = None
    pending_input: PendingInput | None = None


def message_post(
    *,
    session: Session,
    content: str,
    mode: str = InputMode.AUTO,
    acting_user,
    budgets: dict | None = None,
    provider_options: dict | None = None,
) -> PostResult:
    """The user says something. With no active run it starts one (queued, enqueued after
    commit); while a run is active the input is stored as pending — never lost, never a
    second concurrent run — and the run reads it at its next safe point (SPEC §8)."""
    from runs_app.services import run_event_append
    from runs_app.tasks import run_enqueue

    content = (content or "").strip()
    if not content:
        raise SessionError("empty_message", "A message needs some text.")
    if len(content) > MAX_MESSAGE_CHARS:
        raise SessionError("message_too_long", f"A message may hold at most {MAX_MESSAGE_CHARS} characters.")
    if mode not in InputMode.values:
        raise SessionError("invalid_mode", f"Unknown mode {mode!r}; use one of {', '.join(InputMode.values)}.")
    with transaction.atomic():
        # Lock the session: two posts at once must not both see "no active run".
        session_lock(session_id=session.pk)
        active = Run.objects.filter(session_id=session.pk, status__in=ACTIVE_STATUSES).first()
        if active is None:
            run, message = session_start_run(
                session=session, content=content, acting_user=acting_user, budgets=budgets, provider_options=provider_options
            )
            run_enqueue(run.id)
            return PostResult(disposition="started_run", run=run, message=message)
        pending = PendingInput.objects.create(session=session, content=content, mode=mode, submitted_by=acting_user)
        run_event_append(
            run_id=active.id,
            kind="input_queued",
            payload={"pending_input": pending.id, "mode": mode, "content": content},
        )
        if mode == InputMode.NEW_INTENT and active.status != RunStatus.RUNNING:
            # Nobody is driving the run to reach a safe point (it waits for a person or is
            # queued): cancel it now; the input then starts the next run.
            from runs_app.engine.cancel import run_cancel_request

            PendingInput.objects.filter(pk=pending.pk).update(resolved_mode=InputMode.NEW_INTENT)
            run_cancel_request(run=active, acting_user=acting_user, reason=f"intent switch: {content[:200]}")
        return PostResult(disposition="pending", run=active, pending_input=pending)


def session_start_run(*, session: Session, content: str, acting_user, budgets=None, provider_options=None):
    """A new queued run whose first message is the user's `content`. Caller holds the session
    lock and enqueues after commit."""
    from runs_app.services import run_create

    run = run_create(session=session, created_by=acting_user, budgets=budgets, provider_options=provider_options)
    (message,) = messages_append(
        session_id=session.pk, messages=[Message(role=MessageRole.USER, content=content, run=run)]
    )
    return run, message


def session_lock(*, session_id) -> None:
    """Serialises what decides whether a session has an active run: posting input, and a run
    ending (which then starts the next one from pending input). Taken before the run's row."""
    Session.objects.select_for_update().filter(pk=session_id).values_list("pk").get()


def session_start_next_run(*, session_id) -> Run | None:
    """After a run ends, the oldest unconsumed input (queued, or arrived too late for the run)
    starts the next run, in arrival order. Called in the same transaction as the terminal
    transition, so an input can never fall between two runs."""
    from django.utils import timezone

    pending = (
        PendingInput.objects.select_for_update()
        .filter(session_id=session_id, consumed_at__isnull=True)
        .order_by("id")
        .first()
    )
    if pending is None:
        return None
    session = Session.objects.get(pk=session_id)
    run, message = session_start_run(session=session, content=pending.content, acting_user=pending.submitted_by)
    PendingInput.objects.filter(pk=pending.pk).update(
        consumed_at=timezone.now(),
        consumed_by=run,
        disposition=InputDisposition.NEW_RUN,
        resolved_mode=pending.resolved_mode or pending.mode,
        message=message,
    )
    from runs_app.tasks import run_enqueue

    run_enqueue(run.id)
    return run
