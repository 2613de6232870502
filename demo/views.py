"""JSON endpoints of the simulated order/payment service, at /sim/ on its own server (demo/asgi.py).

Machine endpoints, so csrf_exempt — except the fault switchboard, which is for staff signed in
with a Django session and therefore checks CSRF (answering JSON, not Django's HTML page).
The service endpoints are async so an injected delay sleeps on the event loop instead of
holding the one thread daphne runs sync views on."""

import functools
import json
from decimal import Decimal, InvalidOperation

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, JsonResponse
from django.shortcuts import render
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from access import policy as access
from approvals_app.services import audit_record
from demo.client import DESK_TOKEN_HEADER, desk_token_valid
from demo.faults import fault_before_work, fault_deliver
from notifications.models import WebhookEndpoint
from demo.accounts import DEMO_WEBHOOK_ENDPOINT
from notifications.outbox import webhook_signature_valid
from demo.models import SimFaultTarget, SimWebhookReceipt
from demo.selectors import (
    sim_fault_list,
    sim_order_detail,
    sim_refund_count,
    sim_refund_get_by_key,
    sim_refund_payload,
    sim_user_level_detail,
    sim_weather_for,
)
from demo.services import CENT, SimError, sim_fault_clear, sim_fault_consume, sim_fault_set, sim_refund_book

MAX_IDEMPOTENCY_KEY_LENGTH = 255
# The gateway refunds no more than this at once (and Decimal work stays bounded).
MAX_AMOUNT = Decimal("1000000000.00")
# A fault is armed for at most this many calls (or -1: until cleared).
MAX_FAULT_COUNT = 10_000


def _error(status: int, code: str, detail: str = "", **extra) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "detail": detail, **extra}}, status=status)


def _method_not_allowed(request: HttpRequest, allowed: list[str]) -> JsonResponse:
    response = _error(405, "method_not_allowed", f"{request.method} not allowed; use {', '.join(allowed)}")
    response["Allow"] = ", ".join(allowed)
    return response


def _json_body(request: HttpRequest) -> dict:
    try:
        payload = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise SimError(400, "invalid_json", str(exc)) from exc
    if not isinstance(payload, dict):
        raise SimError(400, "invalid_json", "the body must be a JSON object")
    return payload


def _refuse_nul(view):
    """Text with NUL cannot be stored or looked up (PostgreSQL text): refuse it up front."""
    @functools.wraps(view)
    async def checked(request: HttpRequest, *args, **kwargs):
        values = [request.path, request.headers.get("Idempotency-Key", ""), *request.GET.values(), *map(str, kwargs.values())]
        if any("\x00" in value for value in values):
            return _error(400, "invalid_request", "text must not contain NUL characters")
        return await view(request, *args, **kwargs)

    return checked


def _amount(value) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SimError(400, "invalid_amount", "amount must be a decimal string such as \"25.00\"")
    try:
        amount = Decimal(str(value))
    except InvalidOperation as exc:
        raise SimError(400, "invalid_amount", f"not a decimal: {value!r}") from exc
    if not amount.is_finite() or amount <= 0 or amount > MAX_AMOUNT or amount != amount.quantize(CENT):
        raise SimError(400, "invalid_amount", f"amount must be positive, at most {MAX_AMOUNT}, with at most 2 decimals")
    return amount.quantize(CENT)


@_refuse_nul
async def order_detail_view(request: HttpRequest, order_id: str) -> JsonResponse:
    if request.method != "GET":
        return _method_not_allowed(request, ["GET"])
    fault = await sync_to_async(sim_fault_consume)(target=SimFaultTarget.ORDER)
    if (refusal := await fault_before_work(fault)) is not None:
        return refusal
    order = await sync_to_async(sim_order_detail)(order_id=order_id)
    if order is None:
        return _error(404, "order_not_found", f"no order {order_id}")
    return await fault_deliver(request, fault, order, 200)


@_refuse_nul
async def user_level_view(request: HttpRequest, user_id: str) -> JsonResponse:
    if request.method != "GET":
        return _method_not_allowed(request, ["GET"])
    fault = await sync_to_async(sim_fault_consume)(target=SimFaultTarget.USER_LEVEL)
    if (refusal := await fault_before_work(fault)) is not None:
        return refusal
    level = await sync_to_async(sim_user_level_detail)(user_id=user_id)
    if level is None:
        return _error(404, "user_not_found", f"no user {user_id}")
    return await fault_deliver(request, fault, level, 200)


@_refuse_nul
async def weather_view(request: HttpRequest) -> JsonResponse:
    if request.method != "GET":
        return _method_not_allowed(request, ["GET"])
    city = request.GET.get("city", "").strip()
    if not city:
        return _error(400, "city_required", "pass ?city=")
    fault = await sync_to_async(sim_fault_consume)(target=SimFaultTarget.WEATHER)
    if (refusal := await fault_before_work(fault)) is not None:
        return refusal
    return await fault_deliver(request, fault, sim_weather_for(city=city), 200)


@csrf_exempt
@_refuse_nul
async def refunds_view(request: HttpRequest) -> JsonResponse:
    if request.method == "POST":
        return await _refund_create(request)
    if request.method == "GET":
        return await _refund_lookup(request)
    return _method_not_allowed(request, ["GET", "POST"])


async def _refund_create(request: HttpRequest):
    idempotency_key = request.headers.get("Idempotency-Key", "").strip()
    if not idempotency_key:
        return _error(400, "idempotency_key_required", "send an Idempotency-Key header")
    if len(idempotency_key) > MAX_IDEMPOTENCY_KEY_LENGTH:
        return _error(400, "idempotency_key_too_long", f"at most {MAX_IDEMPOTENCY_KEY_LENGTH} characters")
    try:
        payload = _json_body(request)
        order_id, reason = payload.get("order_id"), payload.get("reason", "")
        if not isinstance(order_id, str) or not order_id.strip() or len(order_id) > 64 or "\x00" in order_id:
            raise SimError(400, "invalid_request", "order_id must be a non-empty string of at most 64 characters")
        if not isinstance(reason, str) or len(reason) > 200 or "\x00" in reason:
            raise SimError(400, "invalid_request", "reason must be a string of at most 200 characters")
        amount = _amount(payload.get("amount"))
    except SimError as exc:
        return _error(exc.status, exc.code, exc.detail)

    fault = await sync_to_async(sim_fault_consume)(target=SimFaultTarget.REFUND)
    if (refusal := await fault_before_work(fault)) is not None:
        return refusal
    try:
        refund, replayed = await sync_to_async(sim_refund_book)(
            order_id=order_id.strip(), amount=amount, reason=reason, idempotency_key=idempotency_key
        )
    except SimError as exc:
        return _error(exc.status, exc.code, exc.detail)
    body = {**sim_refund_payload(refund), "replayed": replayed}
    return await fault_deliver(request, fault, body, 200 if replayed else 201)


async def _refund_lookup(request: HttpRequest) -> JsonResponse:
    idempotency_key = request.GET.get("idempotency_key", "").strip()
    if not idempotency_key:
        return _error(400, "idempotency_key_required", "pass ?idempotency_key=")
    fault = await sync_to_async(sim_fault_consume)(target=SimFaultTarget.LOOKUP)
    if (refusal := await fault_before_work(fault)) is not None:
        return refusal
    refund = await sync_to_async(sim_refund_get_by_key)(idempotency_key=idempotency_key)
    if refund is None:
        return _error(404, "refund_not_found", "no refund booked under this key")
    return JsonResponse(sim_refund_payload(refund))


@_refuse_nul
async def refund_count_view(request: HttpRequest) -> JsonResponse:
    if request.method != "GET":
        return _method_not_allowed(request, ["GET"])
    order_id = request.GET.get("order_id") or None
    return JsonResponse({"order_id": order_id, "count": await sync_to_async(sim_refund_count)(order_id=order_id)})


class _JsonCsrfCheck(CsrfViewMiddleware):
    def _reject(self, request, reason):
        return reason


def _csrf_failure(request: HttpRequest) -> str | None:
    check = _JsonCsrfCheck(lambda _request: None)
    check.process_request(request)
    return check.process_view(request, None, (), {})


def service_index_view(request: HttpRequest) -> JsonResponse:
    """What this service is and what it answers: the page `serve_all`'s banner links to."""
    if request.method != "GET":
        return _method_not_allowed(request, ["GET"])
    return JsonResponse({
        "service": "The simulated order and payment service of Warden's demo (demo mode only); it stands "
                   "for an external system, so it has a server of its own. The demo's tools call it.",
        "endpoints": {
            "GET orders/<order id>": "an order",
            "GET users/<user id>/level": "a customer's level",
            "GET weather?city=<city>": "the weather",
            "POST refunds (Idempotency-Key)": "book a refund, once per key",
            "GET refunds?idempotency_key=<key>": "what a key booked (reconciliation)",
            "GET refunds/count?order_id=<order id>": "refunds booked for an order",
            "GET, POST, DELETE faults": "armed faults (signed-in staff, or the desk's demo buttons)",
            "webhooks/": "the demo's webhook receiver and the list of what arrived (signed-in staff)",
        },
        "walk-through": "docs/DEMO.md",
    })


@csrf_exempt  # checked below, so a failure answers JSON
def faults_view(request: HttpRequest) -> JsonResponse:
    """For the desk's demo buttons, server to server (the token of demo.client: no
    cookie, so no CSRF to check), or for signed-in staff in a browser (CSRF checked)."""
    from_desk = desk_token_valid(request.headers.get(DESK_TOKEN_HEADER))
    if not from_desk and not (request.user.is_authenticated and request.user.is_staff):
        return _error(403, "staff_required", "fault injection is for signed-in staff")
    if not from_desk and not access.can_arm_demo_faults(user=request.user):
        # The same permission as the desk's demo buttons (issue 27, finding 12).
        return _error(403, "permission_required", "fault injection needs the demo app's change_simfault permission")
    if request.method not in ("GET", "POST", "DELETE"):
        return _method_not_allowed(request, ["GET", "POST", "DELETE"])
    if not from_desk and (reason := _csrf_failure(request)) is not None:
        return _error(403, "csrf_failed", reason)
    if request.method == "DELETE":
        cleared = sim_fault_clear()
        if not from_desk:  # the desk's buttons audit their own presses (demo/admin.py)
            audit_record(actor=request.user, action="demo_fault_clear", object_type="simfault", object_id="all",
                         before={}, after={"cleared": cleared})
        return JsonResponse({"cleared": cleared})
    if request.method == "POST":
        try:
            payload = _json_body(request)
            delay_seconds, count = payload.get("delay_seconds", 3.0), payload.get("count", 1)
            if isinstance(delay_seconds, bool) or not isinstance(delay_seconds, (int, float)):
                raise SimError(400, "invalid_fault", "delay_seconds must be a number")
            if isinstance(count, bool) or not isinstance(count, int) or count > MAX_FAULT_COUNT:
                raise SimError(400, "invalid_fault", f"count must be an integer of at most {MAX_FAULT_COUNT}")
            fault = {"target": str(payload.get("target", "")), "mode": str(payload.get("mode", "")),
                     "delay_seconds": float(delay_seconds), "count": count}
            sim_fault_set(**fault)
            if not from_desk:
                audit_record(actor=request.user, action="demo_fault_arm", object_type="simfault",
                             object_id=fault["target"], before={}, after=fault)
        except SimError as exc:
            return _error(exc.status, exc.code, exc.detail)
    return JsonResponse({"faults": sim_fault_list()})


# The demo's webhook endpoint (runs_app.WebhookEndpoint), created by `manage.py demo_setup`.
VIEW_RECEIPTS = "demo.view_simwebhookreceipt"


@csrf_exempt
def webhook_receiver_view(request: HttpRequest):
    """Demo mode only: receives Warden's webhooks (POST; the signature is checked with the demo
    endpoint's secret and the result recorded) and lists them for staff (GET)."""
    if not settings.WARDEN_DEMO:
        raise Http404("the webhook receiver exists in demo mode only")
    endpoint = WebhookEndpoint.objects.filter(name=DEMO_WEBHOOK_ENDPOINT).first()
    if request.method == "POST":
        body = request.body
        valid = endpoint is not None and webhook_signature_valid(
            secret=endpoint.secret, webhook_id=request.headers.get("webhook-id", ""),
            timestamp=request.headers.get("webhook-timestamp", ""), body=body,
            signatures=request.headers.get("webhook-signature", ""))
        try:
            kind = str(json.loads(body).get("type", ""))[:60]
        except (ValueError, AttributeError):
            kind = ""
        SimWebhookReceipt.objects.create(webhook_id=request.headers.get("webhook-id", "")[:100],
                                         webhook_timestamp=request.headers.get("webhook-timestamp", "")[:20],
                                         kind=kind, body=body.decode("utf-8", "replace"), signature_valid=valid)
        return JsonResponse({"received": True, "signature_valid": valid}, status=200 if valid else 400)
    if request.method != "GET":
        return _method_not_allowed(request, ["GET", "POST"])
    if request.user.is_authenticated and request.user.is_staff and not request.user.has_perm(VIEW_RECEIPTS):
        return _error(403, "permission_required", "the webhook log needs the demo app's view_simwebhookreceipt permission")
    if not (request.user.is_authenticated and request.user.is_staff):
        # Signing in is Warden's (this server has no login page); the session cookie is the same
        # host's, so it comes back here with it.
        return redirect_to_login(request.build_absolute_uri(), login_url=f"{settings.WARDEN_PUBLIC_URL}/admin/login/")
    receipts = list(SimWebhookReceipt.objects.all()[:100])
    seen: dict[str, int] = {}
    for receipt in reversed(receipts):
        receipt.duplicate = receipt.webhook_id in seen
        seen[receipt.webhook_id] = 1
        try:
            receipt.pretty = json.dumps(json.loads(receipt.body), indent=2, sort_keys=True)
        except ValueError:
            receipt.pretty = receipt.body
    return render(request, "demo/webhooks.html", {"receipts": receipts, "endpoint": endpoint})
