"""What the console's pages and its socket let a user do, shared by both so they never disagree:
every check asks the access policy (access.policy), every change is an orchestration
action (engine/actions/). A refusal is a config.errors.WardenError, as everywhere."""

import uuid

from config.errors import CommonRefusal, WardenError
from approvals_app.models import Approval

from config.storable import storable_text
from config.throttling import user_write_throttled
from engine.actions.approvals import approval_decide
from engine.actions.cancel import run_cancel_request
from config.fair_share import session_turn
from engine.actions.messages import PostResult, held_input_drop, held_input_send, message_post
from engine.actions.sessions import session_open
from runs_app.models import Run
from access import policy as access
from sessions_app.models import InputMode, PendingInput, Session
from sessions_app.services import MAX_MESSAGE_CHARS

# As the API's: a cancel reason and a decision note.
CANCEL_REASON_CHARS = 300
DECISION_NOTE_CHARS = 2000


def console_text(value, *, field: str, limit: int) -> str:
    """Text from a console form or the socket, held to what the API accepts for the same field
    (length, no NUL, valid Unicode): a refusal, not a database error after the fact."""
    text = str(value or "").strip()
    if len(text) > limit:
        raise WardenError(CommonRefusal.BAD_REQUEST, f"The {field} may hold at most {limit} characters.")
    try:
        return storable_text(text)
    except ValueError as error:
        raise WardenError(CommonRefusal.BAD_REQUEST, f"The {field} {error}.") from error


def uuid_or_none(value) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except (TypeError, ValueError, AttributeError):
        return None


def console_write_counted(user) -> None:
    """Every change made in the console counts against the user's write limit, shared with the
    API (WARDEN_API_WRITE_RATE_PER_USER): over it, the change is refused and nothing is written."""
    if (retry_after := user_write_throttled(user)) is not None:
        raise WardenError(CommonRefusal.THROTTLED, f"Too many changes in a short time (rate limit); try again in {retry_after} s.")


def console_session_create(*, user, title, agent=None) -> Session:
    title = console_text(title, field="title", limit=Session._meta.get_field("title").max_length)
    console_write_counted(user)
    return session_open(owner=user, title=title or "New session", agent=agent)


def console_session_get(*, user, session_id) -> Session:
    """The session if `user` may see it. Someone else's session is reported exactly like a
    missing one, so its existence does not leak."""
    pk = uuid_or_none(session_id)
    session = Session.objects.filter(pk=pk).select_related("owner").first() if pk else None
    if session is None or not access.can_see_session(user=user, session=session):
        raise WardenError(CommonRefusal.NOT_FOUND, "No such session.")
    return session


def console_run_get(*, user, run_id) -> Run:
    pk = uuid_or_none(run_id)
    run = Run.objects.filter(pk=pk).select_related("session", "cancel_requested_by").first() if pk else None
    if run is None or not access.can_see_run(user=user, run=run):
        raise WardenError(CommonRefusal.NOT_FOUND, "No such run.")
    return run


def console_message_post(*, user, session_id, content: str, mode: str) -> PostResult:
    session = console_session_get(user=user, session_id=session_id)
    if not access.can_post_in_session(user=user, session=session):
        raise WardenError(CommonRefusal.NOT_PERMITTED, "Only the session's owner can write in it.")
    content = console_text(content, field="message", limit=MAX_MESSAGE_CHARS)
    console_write_counted(user)
    with session_turn(session.pk):  # the session's other posts first, waiting without a connection
        return message_post(session=session, content=content, mode=mode or InputMode.AUTO, acting_user=user)


def console_run_cancel(*, user, run_id, reason: str = "") -> Run:
    run = console_run_get(user=user, run_id=run_id)
    if not access.can_cancel_run(user=user, run=run, even_if_ended=True):
        raise WardenError(CommonRefusal.NOT_PERMITTED, "Only the session's owner or an operator can cancel this run.")
    reason = console_text(reason, field="reason", limit=CANCEL_REASON_CHARS)
    console_write_counted(user)
    with session_turn(run.session_id):
        return run_cancel_request(run=run, acting_user=user, reason=reason or "cancelled from the console")


def console_approval_decide(*, user, approval_id, decision: str, note: str = "") -> Approval:
    pk = uuid_or_none(approval_id)
    approval = Approval.objects.select_related("run__session").filter(pk=pk).first() if pk else None
    if approval is None or not access.can_see_approval(user=user, approval=approval):
        raise WardenError(CommonRefusal.NOT_FOUND, "No such approval.")
    if decision not in ("approve", "reject"):
        raise WardenError(CommonRefusal.BAD_REQUEST, "decision must be 'approve' or 'reject'.")
    note = console_text(note, field="note", limit=DECISION_NOTE_CHARS)
    console_write_counted(user)
    return approval_decide(approval=approval, decision=decision, note=note, acting_user=user)


def console_held_input_get(*, user, pending_id) -> PendingInput:
    """Input of a session `user` may post in; someone else's is reported as missing."""
    try:
        pk = int(pending_id)
    except (TypeError, ValueError):
        pk = None
    pending = PendingInput.objects.select_related("session").filter(pk=pk).first() if pk else None
    if pending is None or not access.can_see_session(user=user, session=pending.session):
        raise WardenError(CommonRefusal.NOT_FOUND, "No such input.")
    if not access.can_post_in_session(user=user, session=pending.session):
        raise WardenError(CommonRefusal.NOT_PERMITTED, "Only the session's owner can choose what becomes of its input.")
    return pending


def console_held_input_choose(*, user, pending_id, choice: str) -> PostResult | PendingInput:
    """The customer's choice about input held from a cancelled run: `send` it as a new request
    (it starts a run, or waits for the active one) or `drop` it."""
    pending = console_held_input_get(user=user, pending_id=pending_id)
    if choice not in ("send", "drop"):
        raise WardenError(CommonRefusal.BAD_REQUEST, "choice must be 'send' or 'drop'.")
    console_write_counted(user)
    with session_turn(pending.session_id):
        if choice == "send":
            return held_input_send(pending=pending, acting_user=user)
        return held_input_drop(pending=pending, acting_user=user)
