"""How an armed fault shapes a response of the simulated service: a pause, a refusal before
any work, a reply the client gives up on, or a connection cut mid-body."""

import asyncio
import json
import sys

from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse

from demo.models import SimFault, SimFaultMode


async def fault_before_work(fault: SimFault | None) -> JsonResponse | None:
    """Apply the part of a fault that happens before any work; a response means: stop here."""
    if fault is None:
        return None
    if fault.mode == SimFaultMode.DELAY:
        await asyncio.sleep(fault.delay_seconds)
    if fault.mode == SimFaultMode.ERROR_BEFORE_BOOKING:
        return JsonResponse(
            {"error": {"code": "gateway_unavailable", "detail": "injected fault", "booked": False}}, status=503
        )
    return None


async def fault_deliver(request: HttpRequest, fault: SimFault | None, body: dict, status: int):
    """Answer `body` once the work is done and committed, as late or as broken as the fault says."""
    mode = fault.mode if fault is not None else SimFaultMode.NONE
    if mode == SimFaultMode.TIMEOUT_AFTER_BOOKING:
        await asyncio.sleep(fault.delay_seconds)
    if mode == SimFaultMode.DROP_AFTER_BOOKING:
        return dropped_response(request, body, status)
    return JsonResponse(body, status=status)


def dropped_response(request: HttpRequest, body: dict, status: int) -> StreamingHttpResponse:
    """Headers and half the body, then the connection goes away: the client sees an incomplete
    response (httpx: RemoteProtocolError), as when a gateway dies after booking.

    Content-Length promises the whole body. Under daphne the TCP transport is then closed
    from the event loop (twisted never enforces Content-Length itself); under other servers
    the short body either makes the server drop the connection (h11-based ones) or leaves the
    client waiting for the missing bytes until its timeout (Django's WSGI dev/test server)."""
    payload = json.dumps(body).encode()
    head = payload[: len(payload) // 2]
    if isinstance(request, ASGIRequest):
        scope = request.scope

        async def stream():
            yield head
            _asgi_connection_close(scope)

        content = stream()
    else:
        content = iter([head])
    response = StreamingHttpResponse(content, status=status, content_type="application/json")
    response["Content-Length"] = str(len(payload))
    return response


def _asgi_connection_close(scope: dict) -> bool:
    """Close the TCP connection that carries `scope`, if the server is daphne (twisted).
    Runs on the reactor's own event loop, so touching the transport is safe."""
    if "twisted.internet.reactor" not in sys.modules:
        return False
    from twisted.internet import reactor, tcp

    client, server = scope.get("client"), scope.get("server")
    if not client or not server:
        return False
    for transport in reactor.getReaders():
        if not isinstance(transport, tcp.Server):
            continue
        peer, host = transport.getPeer(), transport.getHost()
        if (peer.host, peer.port) == (client[0], client[1]) and host.port == server[1]:
            # loseConnection flushes what was written (headers, half the body), then closes.
            transport.loseConnection()
            return True
    return False
