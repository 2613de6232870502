"""The HTTP API's rate limits (django-ninja throttles), counted in the shared cache so every web
process adds to the same count. The limits are settings (config/settings.py, WARDEN_API_RATE_*),
read at each request.

Each limit is a sliding window, approximated from two fixed windows' counts (`window_counts`), each
request one atomic increment in the store every web process shares: exact under any concurrency."""

import math
import threading
import time

from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.db import DatabaseCache
from django.core.cache.backends.redis import RedisCache
from django.db import connections
from ninja.throttling import SimpleRateThrottle

SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


class _SettingsRateThrottle(SimpleRateThrottle):
    setting: str

    def __init__(self):
        # The rate is read per request (not once at import), and the per-request state is the
        # thread's own: one throttle object serves every request of the process.
        self._state = threading.local()

    def identity(self, request) -> str | None:
        raise NotImplementedError

    def allow_request(self, request) -> bool:
        ident = self.identity(request)
        self._state.retry_after = None if ident is None else self.hit(ident)
        return self._state.retry_after is None

    def hit(self, ident: str) -> int | None:
        """Count one request of `ident`; None when it is within the limit, else the seconds
        until it would be. One atomic increment (PostgreSQL's INSERT … ON CONFLICT DO UPDATE …
        RETURNING, or Redis's INCR), so concurrent requests never read the same count: a sliding
        window approximated from the current fixed window and the previous one, weighted by how much
        of it the sliding window still covers (issue 27, finding 5: a read-modify-write of a list of
        timestamps let 90 writes past a limit of 60 at concurrency 8)."""
        limit, window = self.parse_rate(getattr(settings, self.setting))
        now = time.time()
        start = int(now // window) * window
        key = f"throttle:{self.scope}:{ident}:{window}"
        current, previous = window_counts(key=key, start=start, window=window)
        covered = 1 - (now - start) / window  # of the previous window, what the sliding one still holds
        estimate = previous * covered + current
        if estimate <= limit:
            return None
        if current > limit:
            return max(1, math.ceil(start + window - now))  # this window alone is over: until it ends
        # Over because of the previous window: until enough of it has slid out.
        excess = estimate - limit
        return max(1, math.ceil(excess / max(previous, 1) * window))

    def wait(self) -> float | None:
        return getattr(self._state, "retry_after", None)


class ApiKeyRateThrottle(_SettingsRateThrottle):
    """Requests made with one API key (WARDEN_API_RATE_PER_KEY)."""

    scope = "key"
    setting = "WARDEN_API_RATE_PER_KEY"

    def identity(self, request):
        key_id = getattr(getattr(request, "auth", None), "api_key_id", None)
        return None if key_id is None else str(key_id)


class UserRateThrottle(_SettingsRateThrottle):
    """Requests made by one user, through all their keys and their browser (WARDEN_API_RATE_PER_USER)."""

    scope = "user"
    setting = "WARDEN_API_RATE_PER_USER"

    def identity(self, request):
        user = getattr(request, "auth", None)
        return None if user is None else str(user.pk)


class UserWriteRateThrottle(_SettingsRateThrottle):
    """Unsafe requests — new sessions, messages that start runs, cancels, decisions — of one user
    (WARDEN_API_WRITE_RATE_PER_USER)."""

    scope = "user-writes"
    setting = "WARDEN_API_WRITE_RATE_PER_USER"

    def identity(self, request):
        user = getattr(request, "auth", None)
        if request.method in SAFE_METHODS or user is None:
            return None
        return str(user.pk)


API_THROTTLES = [ApiKeyRateThrottle(), UserRateThrottle(), UserWriteRateThrottle()]
_USER_WRITES = API_THROTTLES[2]


def user_write_throttled(user) -> int | None:
    """The console's changes (new sessions, messages, cancels, decisions over its pages and its
    socket) count against the same per-user write limit as the API's: None when this one is
    within it, else the seconds until it would be."""
    return _USER_WRITES.hit(str(user.pk))


def window_counts(*, key: str, start: int, window: int) -> tuple[int, int]:
    """Add one to `key`'s count in the window starting at `start` (epoch seconds) and return it with
    the previous window's count — atomically, in the shared store every web process counts in:
    Redis when the default cache is Redis, PostgreSQL (the rate_counter table; the sweeper drops
    expired windows) when it is the database cache, else the cache itself (a process's own memory:
    add and incr are atomic under its lock)."""
    backend = caches["default"]
    if isinstance(backend, RedisCache):
        client = backend._cache.get_client(key, write=True)
        name, before = backend.make_key(f"{key}:{start}"), backend.make_key(f"{key}:{start - window}")
        with client.pipeline() as pipe:
            pipe.incr(name)
            pipe.expire(name, 2 * window + 60)
            pipe.get(before)
            current, _, previous = pipe.execute()
        return int(current), int(previous or 0)
    if not isinstance(backend, DatabaseCache):
        name, before = f"{key}:{start}", f"{key}:{start - window}"
        backend.add(name, 0, 2 * window + 60)
        return backend.incr(name), int(backend.get(before) or 0)
    key = backend.make_key(key)  # this deployment's (and this test run's) prefix, as in the cache
    with connections["default"].cursor() as cursor:
        cursor.execute(_COUNT_SQL, [key, start, start + 2 * window + 60, key, start - window])
        current, previous = cursor.fetchone()
    return current, previous


_COUNT_SQL = """
WITH bumped AS (
    INSERT INTO "warden_rate_counter" ("key", "start", "expires", "count") VALUES (%s, %s, %s, 1)
    ON CONFLICT ("key", "start") DO UPDATE SET "count" = "warden_rate_counter"."count" + 1
    RETURNING "count")
SELECT (SELECT "count" FROM bumped),
       COALESCE((SELECT "count" FROM "warden_rate_counter" WHERE "key" = %s AND "start" = %s), 0)
"""
