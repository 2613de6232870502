"""Every caller's fair share of a web process's database connections (issue 27, finding 4): 50
concurrent posts by one customer, each waiting on the same session's row lock while holding one of
the pool's ten connections, answered 500 after the pool's timeout and made another customer's
`GET /me` wait half a minute. A caller — one API key, one browser session, else one address — may
have WARDEN_DB_FAIR_SHARE requests in a process at once (default half the pool); one more is answered
`503 {"code": "try_again"}` with Retry-After at once, before it takes a connection.

And the writes of one session take turns in a process before they wait on its row (`session_turn`):
the burst's posts queued on the session's row lock, each holding a pooled connection while it
waited. Now one of them waits on the row; the others wait for their turn without a connection."""

import contextlib
import hashlib
import threading

from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from prometheus_client import Gauge

from config.errors import CommonRefusal, WardenError

TURN_WAITING = Gauge("warden_session_turn_waiting",
                     "Requests of this web process waiting, without a database connection, for their session's turn")

# Never held back: health checks and scrapes, and files.
EXEMPT = ("/healthz", "/readyz", "/metrics", "/static/")


def _caller(request) -> str:
    credential = request.META.get("HTTP_AUTHORIZATION") or request.COOKIES.get(settings.SESSION_COOKIE_NAME)
    if credential:
        return hashlib.sha256(credential.encode()).hexdigest()[:24]
    return "address:" + request.META.get("REMOTE_ADDR", "")


class FairShareMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        self.lock = threading.Lock()
        self.in_flight: dict[str, int] = {}

    def __call__(self, request):
        share = settings.WARDEN_DB_FAIR_SHARE
        if not share or request.path.startswith(EXEMPT):
            return self.get_response(request)
        caller = _caller(request)
        with self.lock:
            if self.in_flight.get(caller, 0) >= share:
                return JsonResponse({"code": "try_again", "message": (
                    f"You have {share} requests in progress on this server, your share of its database connections; "
                    "retry this one in a moment.")}, status=503, headers={"Retry-After": "1"})
            self.in_flight[caller] = self.in_flight.get(caller, 0) + 1
        try:
            return self.get_response(request)
        finally:
            with self.lock:
                left = self.in_flight[caller] - 1
                if left:
                    self.in_flight[caller] = left
                else:
                    del self.in_flight[caller]


class _Turns:
    """One lock per session with writes under way in this process; a lock lives while anyone holds
    or waits for it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sessions: dict[str, list] = {}  # session id -> [its lock, requests holding or waiting]

    def enter(self, key: str) -> threading.Lock:
        with self.lock:
            entry = self.sessions.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
            return entry[0]

    def leave(self, key: str) -> None:
        with self.lock:
            entry = self.sessions[key]
            entry[1] -= 1
            if not entry[1]:
                del self.sessions[key]


TURNS = _Turns()


@contextlib.contextmanager
def session_turn(session_id):
    """A write to a session from a request: the process's other writes to that session first. A
    request that has to wait gives its database connection back to the pool while it waits (outside
    a transaction; a test's wrapping transaction keeps it), and after WARDEN_SESSION_TURN_WAIT
    seconds is answered 503 try_again with Retry-After, having written nothing."""
    key = str(session_id)
    turn = TURNS.enter(key)
    try:
        if not turn.acquire(blocking=False):
            if not connection.in_atomic_block:
                connection.close()  # with a pool: back to it; the turn's holder may need it
            TURN_WAITING.inc()
            try:
                got = turn.acquire(timeout=settings.WARDEN_SESSION_TURN_WAIT)
            finally:
                TURN_WAITING.dec()
            if not got:
                raise WardenError(CommonRefusal.TRY_AGAIN, (
                    f"Other changes to this session were still under way after {settings.WARDEN_SESSION_TURN_WAIT:g} s; "
                    "nothing was written — send this again in a moment."), headers={"Retry-After": "1"})
        try:
            yield
        finally:
            turn.release()
    finally:
        TURNS.leave(key)
