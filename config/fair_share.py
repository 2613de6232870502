"""Every caller's fair share of a web process's database connections (issue 27, finding 4): 50
concurrent posts by one customer, each waiting on the same session's row lock while holding one of
the pool's ten connections, answered 500 after the pool's timeout and made another customer's
`GET /me` wait half a minute. A caller — one API key, one browser session, else one address — may
have WARDEN_DB_FAIR_SHARE requests in a process at once (default half the pool); one more is answered
`503 {"code": "try_again"}` with Retry-After at once, before it takes a connection."""

import hashlib
import threading

from django.conf import settings
from django.http import JsonResponse

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
