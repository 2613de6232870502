"""Doors at the edge of the application (docs/SECURITY.md): the Content-Security-Policy header,
the console websocket's origin check, and static files that never answer a path outside their
folders with a 500."""

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.exceptions import SuspiciousOperation
from django.http import Http404

DEFAULT_PORTS = {"http": 80, "https": 443}


class ContentSecurityPolicyMiddleware:
    """Sends settings.CONTENT_SECURITY_POLICY with every response that has none of its own."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if settings.CONTENT_SECURITY_POLICY:
            response.headers.setdefault("Content-Security-Policy", settings.CONTENT_SECURITY_POLICY)
        return response


def normalized_origin(origin: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of a web origin, the port made explicit; None for anything that is not
    an http(s) origin (`null`, a path, credentials, a bad port)."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.username or parts.password:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    return scheme, parts.hostname.lower(), port or DEFAULT_PORTS[scheme]


class TrustedOriginValidator:
    """Lets a websocket handshake through only when its Origin is exactly — scheme, host and port —
    one of settings.CSRF_TRUSTED_ORIGINS, the origins trusted to post forms with the user's cookies.
    Browsers send the cookies of a socket opened by any page, so the Origin is what tells the
    console from another site (or another port of the same host); DEBUG changes nothing."""

    def __init__(self, application):
        self.application = application

    def allowed(self, origin: str | None) -> bool:
        if origin is None:
            return False
        candidate = normalized_origin(origin)
        return candidate is not None and candidate in {normalized_origin(o) for o in settings.CSRF_TRUSTED_ORIGINS}

    async def __call__(self, scope, receive, send):
        origins = [value for name, value in scope.get("headers", []) if name == b"origin"]
        origin = origins[0].decode("latin1") if len(origins) == 1 else None
        if scope["type"] == "websocket" and self.allowed(origin):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)


class StaticFilesHandler(ASGIStaticFilesHandler):
    """Django's static files handler, with a path that escapes the static folders (`/static/../..`,
    sent as is by a client that does not normalise it) answered 404 like any missing file, not
    500: Django's handler passes only Http404 on to its error responses."""

    def serve(self, request):
        try:
            return super().serve(request)
        except (SuspiciousOperation, ValueError) as error:  # ValueError: a NUL byte in the path
            raise Http404("No such static file.") from error
