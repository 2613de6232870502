"""`Idempotency-Key` on every unsafe API call, with Stripe's semantics: a client that retries a
request (after a timeout, say) with the same key and the same body gets the first response again
— nothing is done twice; the same key with a different body is a 409; a request whose key is
still being answered is a 409 to retry shortly. Keys belong to the caller and are kept for
WARDEN_IDEMPOTENCY_KEY_TTL_SECONDS (the sweeper purges older ones). A response that says the
server failed (5xx), throttled (429) or could not authenticate (401) is not kept, so the same
key may be tried again."""

import hashlib
from datetime import timedelta
from functools import wraps

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import IntegrityError, transaction
from django.http import HttpResponse, JsonResponse
from django.utils import timezone

from api.base import API_AUTH
from api.errors import ApiRefusal
from config.errors import WardenError
from sessions_app.models import IdempotencyRecord

HEADER = "Idempotency-Key"
UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
_NOT_KEPT = {401, 429}


def _error(code: ApiRefusal, message: str, **headers) -> JsonResponse:
    refused = WardenError(code, message)
    response = JsonResponse(refused.body(), status=refused.status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def _caller(request):
    """Who the request authenticates as, the way the API will decide it (None: the view refuses)."""
    for auth in API_AUTH:
        try:
            user = auth(request)
        except WardenError:
            return None
        if user:
            return user
    return None


def _fingerprint(request) -> str:
    digest = hashlib.sha256()
    for part in (request.method, request.path, request.META.get("QUERY_STRING", "")):
        digest.update(part.encode() + b"\0")
    digest.update(request.body)
    return digest.hexdigest()


def _replay(record: IdempotencyRecord) -> HttpResponse:
    response = HttpResponse(bytes(record.response_body), status=record.status_code,
                            content_type=record.response_content_type or "application/json")
    response["Idempotent-Replayed"] = "true"
    return response


def idempotent(view):
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        key = request.headers.get(HEADER)
        if request.method not in UNSAFE_METHODS or key is None:
            return view(request, *args, **kwargs)
        if not 1 <= len(key) <= 255 or not key.isprintable():
            return _error(ApiRefusal.INVALID_IDEMPOTENCY_KEY, f"{HEADER} must be 1 to 255 printable characters.")
        user = _caller(request)
        if user is None:
            return view(request, *args, **kwargs)
        try:
            fingerprint = _fingerprint(request)
        except RequestDataTooBig:
            return view(request, *args, **kwargs)  # the API answers 413
        oldest_kept = timezone.now() - timedelta(seconds=settings.WARDEN_IDEMPOTENCY_KEY_TTL_SECONDS)
        IdempotencyRecord.objects.filter(owner=user, key=key, created_at__lt=oldest_kept).delete()
        try:
            with transaction.atomic():
                record = IdempotencyRecord.objects.create(owner=user, key=key, request_hash=fingerprint,
                                                          method=request.method, path=request.path[:500])
        except IntegrityError:
            existing = IdempotencyRecord.objects.filter(owner=user, key=key).first()
            if existing is None:  # the first request failed and let go of the key meanwhile
                return _error(ApiRefusal.IDEMPOTENCY_KEY_IN_USE, "A request with this key was just being answered; retry.",
                              Retry_After="1")
            if existing.request_hash != fingerprint:
                return _error(ApiRefusal.IDEMPOTENCY_KEY_REUSED,
                              f"This {HEADER} was used for a different request; use a new key for a new request.")
            if existing.status_code is None:
                return _error(ApiRefusal.IDEMPOTENCY_KEY_IN_USE,
                              "A request with this key is still being answered; retry shortly.", Retry_After="1")
            return _replay(existing)
        try:
            response = view(request, *args, **kwargs)
        except BaseException:
            IdempotencyRecord.objects.filter(pk=record.pk).delete()
            raise
        if response.status_code >= 500 or response.status_code in _NOT_KEPT or getattr(response, "streaming", False):
            IdempotencyRecord.objects.filter(pk=record.pk).delete()
        else:
            IdempotencyRecord.objects.filter(pk=record.pk).update(
                status_code=response.status_code, response_body=response.content,
                response_content_type=response.get("Content-Type", ""),
            )
        return response

    return wrapper
