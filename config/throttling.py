"""The HTTP API's rate limits (django-ninja throttles), counted in the shared cache so every web
process adds to the same count. The limits are settings (config/settings.py, WARDEN_API_RATE_*),
read at each request.

Each limit is a sliding window: the times of the caller's recent requests, kept in the cache under
one key. Reading and writing that list is not atomic, so a burst spread over several processes
can get a few requests past a limit; the limit still holds over any longer stretch."""

import math
import threading
import time

from django.conf import settings
from django.core.cache import cache
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
        until it would be."""
        limit, window = self.parse_rate(getattr(settings, self.setting))
        key = f"throttle:{self.scope}:{ident}"
        now = time.time()
        history = [stamp for stamp in cache.get(key, []) if stamp > now - window]
        if len(history) >= limit:
            # Free again when the oldest request in the window leaves it.
            return max(1, math.ceil(min(history) + window - now))
        cache.set(key, [now, *history], window)
        return None

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
