"""Demo tools. They reach the simulated order/payment service over real HTTP
(settings.WARDEN_SIM_BASE_URL, read at call time), so timeouts and dropped connections are
real ones (SPEC §6, §12).

Reads turn every transport failure and 5xx into a retryable ToolError. The refund is a write:
only an answer that proves nothing was booked (a 4xx, or a request that never left) is a
ToolError; anything that may have booked it is ToolOutcomeUnknown, resolved by `reconcile`."""

from decimal import Decimal
from typing import Annotated
from urllib.parse import quote

import httpx
from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from demo.models import ShopAccount
from tools_app.models import ToolEffect
from tools_app.registry import (
    ApprovalRequirement,
    Reconciled,
    Tool,
    ToolContext,
    ToolError,
    ToolOutcomeUnknown,
    tool_register,
)

CENT = Decimal("0.01")

# What the simulated services' error codes mean to a customer (tools_app.outcomes): the console
# shows these, and the model is told them in the tool message.
CUSTOMER_TEXTS = {
    "order_not_found": "There is no order with that number.",
    "user_not_found": "There is no customer with that id.",
    "not_eligible": "This order cannot be refunded under the refund policy.",
    "already_refunded": "This order has already been refunded.",
    "amount_exceeds_order": "The amount is more than the order's total.",
    "idempotency_key_reused": "This refund does not match the one already booked for it.",
    "not_applied": "The payment service confirmed the refund did not go through; no money moved.",
    "gateway_unreachable": "The payment service could not be reached; nothing was done.",
    "gateway_misconfigured": "The payment service is not set up correctly; nothing was done.",
    "idempotency_key_missing": "The refund could not be sent safely; nothing was done.",
    "gateway_unavailable": "The service is unavailable right now.",
    "sim_timeout": "The order service did not answer in time.",
    "sim_unreachable": "The order service could not be reached.",
    "sim_misconfigured": "The order service is not set up correctly.",
    "sim_bad_response": "The order service gave an answer we could not read.",
}


def _sim_url(path: str) -> str:
    return settings.WARDEN_SIM_BASE_URL.rstrip("/") + path


def _client(ctx: ToolContext) -> httpx.Client:
    # trust_env=False: the simulated service is local; a proxy from the environment must not
    # stand between the run-time and it.
    return httpx.Client(timeout=ctx.timeout, trust_env=False)


def _error_of(response: httpx.Response) -> tuple[str, str]:
    """The service's (code, detail), or a code derived from the status for non-JSON bodies."""
    try:
        error = response.json().get("error") or {}
        return str(error.get("code") or f"http_{response.status_code}"), str(error.get("detail") or "")
    except (ValueError, AttributeError):
        return f"http_{response.status_code}", response.text[:200]


def _read(ctx: ToolContext, path: str, params: dict | None = None) -> dict:
    try:
        with _client(ctx) as client:
            response = client.get(_sim_url(path), params=params)
    except httpx.TimeoutException as exc:
        raise ToolError("sim_timeout", str(exc) or type(exc).__name__, retryable=True) from exc
    except httpx.TransportError as exc:
        raise ToolError("sim_unreachable", str(exc) or type(exc).__name__, retryable=True) from exc
    except httpx.InvalidURL as exc:
        raise ToolError("sim_misconfigured", str(exc)) from exc
    if response.status_code >= 500:
        code, detail = _error_of(response)
        raise ToolError(code, detail or f"HTTP {response.status_code}", retryable=True)
    if response.status_code >= 400:
        raise ToolError(*_error_of(response))
    try:
        return response.json()
    except ValueError as exc:
        raise ToolError("sim_bad_response", "the service answered with something other than JSON", retryable=True) from exc


class _Arguments(BaseModel):
    # Unknown fields the model invents are dropped, never stored and never acted on; text is
    # stripped, so " 1010" is order 1010 — in the stored call and in its business key.
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)


class OrderArguments(_Arguments):
    order_id: str = Field(min_length=1, max_length=64, description="The order number, e.g. \"9527\".")


class UserLevelArguments(_Arguments):
    user_id: str = Field(min_length=1, max_length=64, description="The customer's user id, e.g. \"u1\".")


class WeatherArguments(_Arguments):
    city: str = Field(min_length=1, max_length=100, description="City name, e.g. \"Paris\".")


class NoopArguments(_Arguments):
    i: int = Field(default=0, description="Any number; it is echoed back.")


RefundAmount = Annotated[
    Decimal,
    Field(gt=0, max_digits=12, decimal_places=2),
    WithJsonSchema({"type": "string", "pattern": r"^\d+(\.\d{1,2})?$", "description": "Amount, e.g. \"25.00\"."}),
]


class RefundArguments(_Arguments):
    """Text such as "approved_by" is dropped here: approval is recorded by Warden, not claimed."""

    order_id: str = Field(min_length=1, max_length=64, description="The order to refund in full.")
    amount: RefundAmount
    reason: str = Field(default="customer request", max_length=200, description="Why the customer gets a refund.")

    @field_validator("amount")
    @classmethod
    def _two_decimals(cls, amount: Decimal) -> Decimal:
        # "25", 25 and "25.00" are one refund: the business key must not tell them apart.
        return amount.quantize(CENT)


def _shop_customer(ctx: ToolContext) -> str | None:
    """The shop's id of the customer this call serves (the session's owner, as Warden verified
    them); None when that user has no shop account (demo.models.ShopAccount)."""
    customer = ctx.customer
    if customer is None:
        return None
    return ShopAccount.objects.filter(user_id=customer.id).values_list("shop_user_id", flat=True).first()


def _order_of_this_customer(ctx: ToolContext, order_id: str) -> dict:
    """The order, if it is the customer's own: another customer's order is answered exactly as
    one that does not exist, so a conversation cannot even learn that it exists."""
    order = _read(ctx, f"/orders/{quote(order_id, safe='')}")
    shop_id = _shop_customer(ctx)
    if shop_id is not None and order.get("user_id") != shop_id:
        raise ToolError("order_not_found", f"no order {order_id} for this customer")
    return order


def query_order(ctx: ToolContext, args: OrderArguments) -> dict:
    return _order_of_this_customer(ctx, args.order_id)


def query_user_level(ctx: ToolContext, args: UserLevelArguments) -> dict:
    shop_id = _shop_customer(ctx)
    if shop_id is not None and args.user_id != shop_id:
        raise ToolError("user_not_found", f"no customer {args.user_id} for this conversation")
    return _read(ctx, f"/users/{quote(args.user_id, safe='')}/level")


def get_weather(ctx: ToolContext, args: WeatherArguments) -> dict:
    return _read(ctx, "/weather", params={"city": args.city})


def noop(ctx: ToolContext, args: NoopArguments) -> dict:
    return {"i": args.i}


def execute_refund(ctx: ToolContext, args: RefundArguments) -> dict:
    if not ctx.idempotency_key:
        # The run-time must commit the key before calling; without it nothing is sent.
        raise ToolError("idempotency_key_missing", "refusing to send a refund without an idempotency key")
    # Only the customer's own order: checked before anything is sent (a refusal here is definite).
    if _shop_customer(ctx) is not None:
        _order_of_this_customer(ctx, args.order_id)
    body = {"order_id": args.order_id, "amount": str(args.amount), "reason": args.reason}
    try:
        with _client(ctx) as client:
            response = client.post(_sim_url("/refunds"), json=body, headers={"Idempotency-Key": ctx.idempotency_key})
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol) as exc:
        # No connection was ever made, so the request never reached the gateway.
        raise ToolError("gateway_unreachable", str(exc) or type(exc).__name__) from exc
    except httpx.InvalidURL as exc:
        raise ToolError("gateway_misconfigured", str(exc)) from exc
    except httpx.TimeoutException as exc:
        raise ToolOutcomeUnknown(f"no answer within {ctx.timeout}s after sending ({type(exc).__name__})") from exc
    except httpx.TransportError as exc:
        # Dropped mid-answer (RemoteProtocolError, ReadError, …): it may have been booked.
        raise ToolOutcomeUnknown(f"connection failed after sending: {type(exc).__name__}: {exc}") from exc
    if response.status_code >= 500:
        code, detail = _error_of(response)
        raise ToolOutcomeUnknown(f"gateway answered {response.status_code} {code} {detail}".strip())
    if 400 <= response.status_code < 500:
        raise ToolError(*_error_of(response))
    if response.status_code not in (200, 201):
        raise ToolOutcomeUnknown(f"unexpected gateway answer {response.status_code}")
    try:
        return response.json()
    except ValueError as exc:
        raise ToolOutcomeUnknown("the gateway accepted the request but its answer was unreadable") from exc


def reconcile_refund(ctx: ToolContext, args: RefundArguments) -> Reconciled | None:
    """Ask the gateway what it booked under our key; None when it cannot tell us right now."""
    if not ctx.idempotency_key:
        return None
    try:
        with _client(ctx) as client:
            response = client.get(_sim_url("/refunds"), params={"idempotency_key": ctx.idempotency_key})
    except httpx.HTTPError:
        return None
    if response.status_code == 200:
        try:
            return Reconciled(applied=True, result=response.json(), detail="refund found by idempotency key")
        except ValueError:
            return None
    # Only the service's own "no such refund" counts: a 404 from a misrouted URL proves nothing.
    if response.status_code == 404 and _error_of(response)[0] == "refund_not_found":
        return Reconciled(applied=False, detail="no refund booked under this key")
    return None


def _order_summary(arguments: dict, result: dict) -> str:
    """One line of what the look-up found: "Order 9527: delivered, 25.00 USD, can be refunded."."""
    refund = ("already refunded" if result.get("refunded") else
              "can be refunded" if result.get("refund_eligible") else "cannot be refunded")
    return f"Order {result['order_id']}: {result['status']}, {result['amount']} {result['currency']}, {refund}."


tool_register(
    Tool(
        name="query_order",
        description="Look up an order: amount, status and whether it can be refunded.",
        arguments=OrderArguments,
        effect=ToolEffect.READ,
        execute=query_order,
        timeout=5.0,
        summary=_order_summary,
        extra={"customer_texts": CUSTOMER_TEXTS},
    )
)
tool_register(
    Tool(
        name="query_user_level",
        description="Look up a customer's membership level (gold, silver, …).",
        arguments=UserLevelArguments,
        effect=ToolEffect.READ,
        execute=query_user_level,
        timeout=5.0,
        summary="Level: {level}.",
        extra={"customer_texts": CUSTOMER_TEXTS},
    )
)
tool_register(
    Tool(
        name="get_weather",
        description="Current weather for a city.",
        arguments=WeatherArguments,
        effect=ToolEffect.READ,
        execute=get_weather,
        timeout=5.0,
        summary="{city}: {summary}, {temperature_c} °C.",
        extra={"customer_texts": CUSTOMER_TEXTS},
    )
)
tool_register(
    Tool(
        name="noop",
        description="Does nothing and returns its argument; for tests and benchmarks.",
        arguments=NoopArguments,
        effect=ToolEffect.READ,
        execute=noop,
        timeout=1.0,
        max_attempts=1,
        summary="Echoed {i}.",
    )
)
tool_register(
    Tool(
        name="execute_refund",
        description=(
            "Refund an order in full to the customer. Needs an operator's approval, which Warden "
            "requests by itself; check the order with query_order first."
        ),
        arguments=RefundArguments,
        effect=ToolEffect.WRITE,
        execute=execute_refund,
        approval=ApprovalRequirement.OPERATOR,
        timeout=2.0,
        reconcile=reconcile_refund,
        business_key=lambda args: f"refund:{args.order_id}:{args.amount}",
        # The demo shop sells in US dollars (the simulated orders say so).
        amount="amount",
        currency="USD",
        reference="order_id",
        # The card's one line once the refund went through (the gateway's answer, else what was asked).
        summary="Refunded {amount} {currency}, ref {refund_id}",
        extra={"customer_texts": CUSTOMER_TEXTS},
    )
)
