"""Every request's id: the caller's own `X-Request-ID` when it is a plain token (a proxy's or a
client's, so one id follows a request through every hop), a new one otherwise. It is bound to
the log context while the request is served — every line logged for it carries `request_id` — and
sent back as `X-Request-ID`, so a caller who reports a failure names the lines that tell it."""

import re
import uuid

from config.logs import log_context

HEADER = "X-Request-ID"
# Printable, no spaces or separators a log or header could be split on; a UUID or a trace id fits.
_ACCEPTED = re.compile(r"[A-Za-z0-9._:-]{8,128}")


def request_id_of(request) -> str:
    """The request's id, taken from its header when acceptable and made otherwise; kept on the request."""
    if not hasattr(request, "request_id"):
        offered = request.META.get("HTTP_X_REQUEST_ID", "")
        request.request_id = offered if _ACCEPTED.fullmatch(offered) else uuid.uuid4().hex
    return request.request_id


class RequestIdMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request_id = request_id_of(request)
        with log_context(request_id=request_id):
            response = self.get_response(request)
        response[HEADER] = request_id
        return response
