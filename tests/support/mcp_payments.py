"""A reference MCP server standing in for a payment provider's MCP server.

Built with the official MCP Python SDK (``mcp`` 2.3, ``mcp.server.mcpserver.MCPServer``). Warden's tests
call tools on it as the agent run-time would call a real provider, and read back what the provider saw
through plain HTTP control routes on the same port.

Run it::

    python -m tests.support.mcp_payments --port 8765 [--token T] [--transport http|stdio]

HTTP transport: streamable HTTP at ``/mcp`` (stateless, JSON responses), plus the control routes
(no auth):

- ``GET  /control/state``   -> ``{"bookings": {key: refund}, "calls": [...], "mode": ..., "variant": ...}``
- ``POST /control/mode``    body ``{"mode": "...", "seconds": N}``
- ``POST /control/variant`` body ``{"variant": "v1" | "v2"}``
- ``POST /control/reset``   bookings, call log, mode and variant back to the defaults

With ``--token T`` every request to ``/mcp`` must carry ``Authorization: Bearer T``, else HTTP 401 (the
SDK's own bearer-auth answer: ``{"error": "invalid_token", ...}`` plus ``WWW-Authenticate``). A rejected
``tools/call`` is still logged (``authorized: false``); the token itself is never stored.

Every ``tools/call`` that reaches the server is logged as ``{"tool", "arguments", "meta_key",
"header_key", "authorized", "at"}``: ``meta_key`` is ``_meta["dev.warden/idempotency-key"]``,
``header_key`` the HTTP ``Idempotency-Key`` header (both ``None`` when absent), ``authorized`` whether
the call passed the server's auth check (always true when the server runs without a token).

Fault modes for ``refund`` (set through ``/control/mode``; each sticks until reset):

- ``normal``              book and answer.
- ``hang_after_booking``  book, then sleep ``seconds`` (default 30) before answering.
- ``drop_after_booking``  book, then abort the TCP connection without any HTTP response.
- ``is_error``            book nothing; an ``isError`` result "insufficient funds on the merchant account".
- ``jsonrpc_error``       book nothing; a JSON-RPC error (-32603, "refund service unavailable").
- ``invalid_content``     book, then answer with ``result.content == "not a list"`` (not valid MCP).
- ``slow``                sleep ``seconds`` (default 30) before booking, then book and answer.

Tool-list variants (``/control/variant``): ``v1`` (default) has the five tools; ``v2`` drops
``lookup_order`` and gives ``refund`` a required ``note`` argument (its description says "v2");
``v3`` drops ``lookup_order`` too but gives ``refund`` an optional ``note`` (a compatible change).
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
from datetime import datetime, timezone
from typing import Annotated, Any

import anyio
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from typing_extensions import NotRequired, TypedDict  # pydantic needs these on Python < 3.12

from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError

logger = logging.getLogger("mcp_payments")

IDEMPOTENCY_META_KEY = "dev.warden/idempotency-key"
IDEMPOTENCY_HEADER = "idempotency-key"
MCP_PATH = "/mcp"
MODES = (
    "normal",
    "hang_after_booking",
    "drop_after_booking",
    "is_error",
    "jsonrpc_error",
    "invalid_content",
    "slow",
)
VARIANTS = ("v1", "v2", "v3")
DEFAULT_SECONDS = 30.0
JSONRPC_ERROR_CODE = -32603
JSONRPC_ERROR_MESSAGE = "refund service unavailable"
IS_ERROR_TEXT = "insufficient funds on the merchant account"

INITIAL_ORDERS: dict[str, dict[str, str]] = {
    "9527": {"order_id": "9527", "customer": "alice", "amount": "9.00", "currency": "EUR", "status": "paid"},
    "9528": {"order_id": "9528", "customer": "bob", "amount": "25.00", "currency": "EUR", "status": "paid"},
}


# --------------------------------------------------------------------------------------------------
# Result shapes (TypedDicts give the tools real output schemas)


class Order(TypedDict):
    order_id: str
    customer: str
    amount: str
    currency: str
    status: str


class Refund(TypedDict):
    refund_id: str
    order_id: str
    amount: float
    currency: str
    status: str


class FindRefundResult(TypedDict):
    applied: bool
    result: NotRequired[Refund]


class ClosedAccount(TypedDict):
    closed: str


class NewsletterSent(TypedDict):
    sent: bool


# --------------------------------------------------------------------------------------------------
# State


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class PaymentsState:
    """The provider's in-memory world: orders, refund bookings by idempotency key, the call log."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.orders: dict[str, dict[str, str]] = {k: dict(v) for k, v in INITIAL_ORDERS.items()}
            self.bookings: dict[str, dict[str, Any]] = {}
            # Refunds booked without any idempotency key (they still count as bookings).
            self.unkeyed_bookings: list[dict[str, Any]] = []
            self.calls: list[dict[str, Any]] = []
            self.mode = "normal"
            self.seconds = DEFAULT_SECONDS
            self.variant = "v1"
            self._next_refund = 1

    def log_call(
        self,
        tool: Any,
        arguments: Any,
        meta_key: Any,
        header_key: Any,
        authorized: bool,
    ) -> None:
        with self._lock:
            self.calls.append(
                {
                    "tool": tool,
                    "arguments": arguments,
                    "meta_key": meta_key,
                    "header_key": header_key,
                    "authorized": authorized,
                    "at": _now(),
                }
            )

    def book(self, key: str | None, order_id: str, amount: float, currency: str) -> dict[str, Any]:
        """Book a refund once per key: the same key again returns the booking it made before."""
        with self._lock:
            if key is not None and key in self.bookings:
                return dict(self.bookings[key])
            refund = {
                "refund_id": f"R-{self._next_refund}",
                "order_id": order_id,
                "amount": amount,
                "currency": currency,
                "status": "booked",
            }
            self._next_refund += 1
            if key is None:
                self.unkeyed_bookings.append(refund)
            else:
                self.bookings[key] = refund
            return dict(refund)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return json.loads(
                json.dumps(
                    {
                        "bookings": self.bookings,
                        "unkeyed_bookings": self.unkeyed_bookings,
                        "calls": self.calls,
                        "mode": self.mode,
                        "seconds": self.seconds,
                        "variant": self.variant,
                    }
                )
            )

    def is_authorized(self, authorization: str | None) -> bool:
        if self.token is None:
            return True
        return authorization == f"Bearer {self.token}"


# --------------------------------------------------------------------------------------------------
# The MCP server


def _meta_key(meta: Any) -> str | None:
    if isinstance(meta, dict):
        value = meta.get(IDEMPOTENCY_META_KEY)
        return value if isinstance(value, str) else None
    return None


def _header(headers: Any, name: str) -> str | None:
    if headers is None:
        return None
    try:
        return headers.get(name)
    except AttributeError:
        return None


def _error(text: str) -> CallToolResult:
    """An isError tool result carrying exactly `text` (a raised ToolError would be prefixed by the SDK)."""
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def _idempotency_key(ctx: Context) -> str | None:
    """`_meta["dev.warden/idempotency-key"]`, else the `Idempotency-Key` HTTP header, else None."""
    key = _meta_key(ctx.request_context.meta)
    if key is None:
        key = _header(ctx.headers, IDEMPOTENCY_HEADER)
    return key


def build_server(state: PaymentsState) -> MCPServer:
    mcp = MCPServer(
        "payments",
        title="Payments (Warden reference MCP server)",
        instructions="A payment provider: look up orders, book refunds idempotently, reconcile them.",
        version="1.0.0",
        log_level="WARNING",
    )

    # ---- call log: a context-tier middleware sees every tools/call, even one for an unknown tool

    async def log_tool_calls(ctx: ServerRequestContext[Any, Any], call_next: Any) -> Any:
        if ctx.method == "tools/call" and ctx.request_id is not None:
            params = ctx.params or {}
            request = ctx.request
            headers = getattr(request, "headers", None)
            state.log_call(
                tool=params.get("name"),
                arguments=params.get("arguments"),
                meta_key=_meta_key(params.get("_meta")),
                header_key=_header(headers, IDEMPOTENCY_HEADER),
                authorized=state.is_authorized(_header(headers, "authorization")),
            )
        return await call_next(ctx)

    mcp.middleware.append(log_tool_calls)

    # ---- tools

    def lookup_order(
        order_id: Annotated[str, Field(description="The provider's order id, e.g. '9527'.")],
    ) -> Order:
        """Look up one order by its id: customer, amount, currency and payment status. Reads only."""
        order = state.orders.get(order_id)
        if order is None:
            return _error(f"no order {order_id}")  # type: ignore[return-value]
        return Order(**order)  # type: ignore[typeddict-item]

    async def _refund(ctx: Context, order_id: str, amount: float, currency: str) -> Refund:
        key = _idempotency_key(ctx)
        mode, seconds = state.mode, state.seconds
        if mode == "is_error":
            return _error(IS_ERROR_TEXT)  # type: ignore[return-value]
        if mode == "jsonrpc_error":
            # MCPError passes through MCPServer untouched and becomes a JSON-RPC error response.
            raise MCPError(code=JSONRPC_ERROR_CODE, message=JSONRPC_ERROR_MESSAGE)
        if order_id not in state.orders:
            return _error(f"no order {order_id}")  # type: ignore[return-value]
        if mode == "slow":
            await anyio.sleep(seconds)
        refund = state.book(key, order_id, amount, currency)
        if mode == "hang_after_booking":
            await anyio.sleep(seconds)
        # drop_after_booking and invalid_content are finished by the ASGI layer (FaultLayer).
        return Refund(**refund)  # type: ignore[typeddict-item]

    async def refund(
        order_id: Annotated[str, Field(description="The order to refund, e.g. '9527'.")],
        amount: Annotated[float, Field(description="Amount to refund, in the order's currency, e.g. 9.0.")],
        currency: Annotated[str, Field(description="ISO 4217 currency code, e.g. 'EUR'.")],
        ctx: Context,
        reason: Annotated[str, Field(description="Free-text reason shown to the customer.")] = "",
    ) -> Refund:
        """Refund (part of) an order. Moves money: book once per idempotency key.

        Send the idempotency key in the request's _meta under "dev.warden/idempotency-key" (or the
        Idempotency-Key HTTP header); a repeated key returns the refund booked the first time.
        """
        return await _refund(ctx, order_id, amount, currency)

    async def refund_v2(
        order_id: Annotated[str, Field(description="The order to refund, e.g. '9527'.")],
        amount: Annotated[float, Field(description="Amount to refund, in the order's currency, e.g. 9.0.")],
        currency: Annotated[str, Field(description="ISO 4217 currency code, e.g. 'EUR'.")],
        note: Annotated[str, Field(description="Mandatory internal note for the ledger (new in v2).")],
        ctx: Context,
        reason: Annotated[str, Field(description="Free-text reason shown to the customer.")] = "",
    ) -> Refund:
        """Refund (part of) an order (v2: a ledger note is required). Moves money: book once per key.

        Send the idempotency key in the request's _meta under "dev.warden/idempotency-key" (or the
        Idempotency-Key HTTP header); a repeated key returns the refund booked the first time.
        """
        return await _refund(ctx, order_id, amount, currency)

    async def refund_v3(
        order_id: Annotated[str, Field(description="The order to refund, e.g. '9527'.")],
        amount: Annotated[float, Field(description="Amount to refund, in the order's currency, e.g. 9.0.")],
        currency: Annotated[str, Field(description="ISO 4217 currency code, e.g. 'EUR'.")],
        ctx: Context,
        reason: Annotated[str, Field(description="Free-text reason shown to the customer.")] = "",
        note: Annotated[str, Field(description="An optional internal note for the ledger (new in v3).")] = "",
    ) -> Refund:
        """Refund (part of) an order (v3: an optional ledger note). Moves money: book once per key.

        Send the idempotency key in the request's _meta under "dev.warden/idempotency-key" (or the
        Idempotency-Key HTTP header); a repeated key returns the refund booked the first time.
        """
        return await _refund(ctx, order_id, amount, currency)

    def find_refund(
        idempotency_key: Annotated[str, Field(description="The idempotency key the refund was sent with.")],
    ) -> FindRefundResult:
        """Reconcile: report whether a refund was booked under this idempotency key, and which one."""
        booked = state.bookings.get(idempotency_key)
        if booked is None:
            return FindRefundResult(applied=False)
        return FindRefundResult(applied=True, result=Refund(**booked))  # type: ignore[typeddict-item]

    def close_account(
        customer: Annotated[str, Field(description="The customer whose merchant account to close.")],
    ) -> ClosedAccount:
        """Close a customer's account for good. Irreversible."""
        return ClosedAccount(closed=customer)

    def send_newsletter(
        text: Annotated[str, Field(description="The newsletter body sent to every customer.")],
    ) -> NewsletterSent:
        """Send a newsletter to all customers."""
        return NewsletterSent(sent=True)

    read_only = ToolAnnotations(read_only_hint=True)
    money = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True)

    def add_lookup() -> None:
        mcp.add_tool(lookup_order, name="lookup_order", title="Look up an order", annotations=read_only)

    def add_refund(variant: str) -> None:
        fn = {"v1": refund, "v2": refund_v2, "v3": refund_v3}[variant]
        mcp.add_tool(fn, name="refund", title="Refund an order", annotations=money)

    add_lookup()
    add_refund("v1")
    mcp.add_tool(find_refund, name="find_refund", title="Find a refund by idempotency key", annotations=read_only)
    mcp.add_tool(
        close_account,
        name="close_account",
        title="Close an account",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True),
    )
    mcp.add_tool(
        send_newsletter,
        name="send_newsletter",
        title="Send a newsletter",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False),
    )

    def apply_variant(variant: str) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}")
        names = {tool.name for tool in mcp._tool_manager.list_tools()}  # noqa: SLF001
        mcp.remove_tool("refund")
        if "lookup_order" in names:
            mcp.remove_tool("lookup_order")
        if variant == "v1":
            add_lookup()
        add_refund(variant)
        state.variant = variant

    mcp.apply_variant = apply_variant  # type: ignore[attr-defined]
    return mcp


# --------------------------------------------------------------------------------------------------
# Control routes and the ASGI layer (auth, dropped connections, invalid content)


def add_control_routes(mcp: MCPServer, state: PaymentsState) -> None:
    async def read_json(request: Request) -> dict[str, Any]:
        body = await request.body()
        if not body:
            return {}
        data = json.loads(body)
        return data if isinstance(data, dict) else {}

    @mcp.custom_route("/control/state", methods=["GET"])
    async def control_state(request: Request) -> Response:
        return JSONResponse(state.snapshot())

    @mcp.custom_route("/control/mode", methods=["POST"])
    async def control_mode(request: Request) -> Response:
        data = await read_json(request)
        mode = data.get("mode")
        if mode not in MODES:
            return JSONResponse({"error": f"unknown mode {mode!r}", "modes": list(MODES)}, status_code=400)
        seconds = data.get("seconds")
        state.mode = mode
        state.seconds = DEFAULT_SECONDS if seconds is None else float(seconds)
        return JSONResponse({"mode": state.mode, "seconds": state.seconds})

    @mcp.custom_route("/control/variant", methods=["POST"])
    async def control_variant(request: Request) -> Response:
        data = await read_json(request)
        variant = data.get("variant")
        if variant not in VARIANTS:
            return JSONResponse({"error": f"unknown variant {variant!r}", "variants": list(VARIANTS)}, status_code=400)
        mcp.apply_variant(variant)  # type: ignore[attr-defined]
        return JSONResponse({"variant": state.variant})

    @mcp.custom_route("/control/reset", methods=["POST"])
    async def control_reset(request: Request) -> Response:
        state.reset()
        mcp.apply_variant("v1")  # type: ignore[attr-defined]
        return JSONResponse({"reset": True})


class FaultLayer:
    """Outermost ASGI layer in front of the SDK's app, for what a tool cannot do from inside.

    - bearer auth on ``/mcp`` (401 like the SDK's ``RequireAuthMiddleware``; a rejected
      ``tools/call`` is logged with ``authorized: false``);
    - ``drop_after_booking``: let the tool book, swallow its response, abort the TCP connection;
    - ``invalid_content``: let the tool book, then rewrite ``result.content`` to ``"not a list"``.
    """

    def __init__(self, app: ASGIApp, state: PaymentsState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") != MCP_PATH:
            await self.app(scope, receive, send)
            return

        raw_receive = receive
        body, replay = await _buffer_body(receive)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        message = _parse_jsonrpc(body)
        is_call = isinstance(message, dict) and message.get("method") == "tools/call"
        params = message.get("params") if is_call and isinstance(message.get("params"), dict) else {}

        if not self.state.is_authorized(headers.get("authorization")):
            if is_call:
                self.state.log_call(
                    tool=params.get("name"),
                    arguments=params.get("arguments"),
                    meta_key=_meta_key(params.get("_meta")),
                    header_key=headers.get(IDEMPOTENCY_HEADER),
                    authorized=False,
                )
            description = "Authentication required"
            response = JSONResponse(
                {"error": "invalid_token", "error_description": description},
                status_code=401,
                headers={"WWW-Authenticate": f'Bearer error="invalid_token", error_description="{description}"'},
            )
            await response(scope, replay, send)
            return

        mode = self.state.mode
        if not (is_call and params.get("name") == "refund" and mode in ("drop_after_booking", "invalid_content")):
            await self.app(scope, replay, send)
            return

        captured: list[Message] = []

        async def capture(msg: Message) -> None:
            captured.append(msg)

        await self.app(scope, replay, capture)

        if mode == "drop_after_booking":
            transport = getattr(getattr(raw_receive, "__self__", None), "transport", None)
            if transport is not None:
                transport.abort()  # RST: the client gets no status line at all
                return
            # Fallback: start a response that promises more than it delivers, then fail.
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100000")]})
            await send({"type": "http.response.body", "body": b"{", "more_body": True})
            raise RuntimeError("drop_after_booking: connection dropped on purpose")

        # invalid_content
        start = next((m for m in captured if m["type"] == "http.response.start"), None)
        response_body = b"".join(m.get("body", b"") for m in captured if m["type"] == "http.response.body")
        out_headers = [(k, v) for k, v in (start or {}).get("headers", []) if k.lower() != b"content-length"]
        content_type = dict((k.lower(), v) for k, v in out_headers).get(b"content-type", b"")
        new_body = _corrupt_result(response_body, sse=content_type.startswith(b"text/event-stream"))
        out_headers.append((b"content-length", str(len(new_body)).encode()))
        await send({"type": "http.response.start", "status": (start or {}).get("status", 200), "headers": out_headers})
        await send({"type": "http.response.body", "body": new_body})


async def _buffer_body(receive: Receive) -> tuple[bytes, Receive]:
    chunks: list[bytes] = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            break
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            break
    body = b"".join(chunks)
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


def _parse_jsonrpc(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


def _corrupt_one(message: Any) -> Any:
    if isinstance(message, dict) and isinstance(message.get("result"), dict):
        message["result"]["content"] = "not a list"
    return message


def _corrupt_result(body: bytes, *, sse: bool) -> bytes:
    if not sse:
        parsed = _parse_jsonrpc(body)
        return body if parsed is None else json.dumps(_corrupt_one(parsed)).encode()
    lines = []
    for line in body.decode().split("\n"):
        if line.startswith("data:"):
            parsed = _parse_jsonrpc(line[5:].strip().encode())
            if parsed is not None:
                line = "data: " + json.dumps(_corrupt_one(parsed))
        lines.append(line)
    return "\n".join(lines).encode()


def build_http_app(state: PaymentsState, host: str = "127.0.0.1") -> tuple[MCPServer, ASGIApp]:
    mcp = build_server(state)
    add_control_routes(mcp, state)
    app = mcp.streamable_http_app(
        streamable_http_path=MCP_PATH,
        json_response=True,
        stateless_http=True,
        host=host,
    )
    return mcp, FaultLayer(app, state)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' on /mcp")
    parser.add_argument("--transport", choices=("http", "stdio"), default="http")
    args = parser.parse_args(argv)

    state = PaymentsState(token=args.token)
    if args.transport == "stdio":
        build_server(state).run("stdio")
        return

    import uvicorn

    _, app = build_http_app(state, host=args.host)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
