"""Opening a session: the session row and the agent its runs will use."""

from agents.selectors import agent_default
from sessions_app.models import Session
from sessions_app.services import session_create


def session_open(*, owner, title: str = "", agent=None) -> Session:
    """A session whose runs use `agent` — by default the deployment's (settings.WARDEN_DEFAULT_AGENT,
    when it exists); without either, the session has none (every registered tool is offered)."""
    return session_create(owner=owner, title=title, agent=agent if agent is not None else agent_default())
