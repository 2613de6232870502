"""A model call's own HTTP path (runs_app/providers/http.py, issue 34): each run thread keeps its
connection to the model server alive between calls, and what httpx used to do for it still holds —
a body cut short is a broken stream, a redirect is followed, the environment's proxy is not taken.
Against a small HTTP/1.1 server that answers each request with the bytes the test gives it
(a model server misbehaving on purpose); the whole-protocol tests are the llmock ones beside this.
"""

import json
import os
import socket
import struct
import subprocess
import sys
import threading

import pytest
from django.test import override_settings

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from config.tracing import span, tracing_reset, tracing_setup
from runs_app.endpoints import endpoint_default
from runs_app.providers import http as provider_http
from runs_app.providers.base import Finish, ModelRequest, PermanentModelError, TextDelta, TransientModelError
from runs_app.providers.openai import OpenAIProvider

MESSAGES = [{"role": "user", "content": "What is the weather?"}]


def sse_answer(text: str = "sunny") -> bytes:
    """A whole streamed answer, chunked, kept alive."""
    events = [{"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
    body = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
    chunks = b"".join(f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (body[:40], body[40:]))
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunks + b"0\r\n\r\n")


class WireServer:
    """Answers the n-th request with answers[n] (bytes, or a function of the server giving them);
    an answer ending in CLOSE is followed by closing the connection. Records each connection and
    each request's method, target, headers and body."""

    CLOSE = b"<close>"
    RESET = b"<reset>"  # the whole answer: the connection is reset (RST) instead of answered

    def __init__(self, answers: list):
        self.answers = list(answers)
        self.targets: list[str] = []
        self.methods: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.bodies: list[bytes] = []
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        with conn, reader:
            while True:
                request_line = reader.readline()
                if not request_line:
                    return
                headers = {}
                while (line := reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = reader.read(int(headers.get("content-length", 0)))
                with self._lock:
                    self.methods.append(request_line.split()[0].decode())
                    self.targets.append(request_line.split()[1].decode())
                    self.headers.append(headers)
                    self.bodies.append(body)
                    answer = self.answers.pop(0)
                answer = answer(self) if callable(answer) else answer
                if answer == self.RESET:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                closing = answer.endswith(self.CLOSE)
                conn.sendall(answer.removesuffix(self.CLOSE))
                if closing:
                    return


@pytest.fixture
def wire():
    servers = []

    def start(*answers) -> WireServer:
        server = WireServer(list(answers))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture(autouse=True)
def fresh_clients(monkeypatch):
    # This thread's httpx clients are made afresh, after the test has set its environment.
    monkeypatch.setattr(provider_http._clients, "by_timeout", {}, raising=False)


def call(base_url: str) -> list:
    with override_settings(OPENAI_BASE_URL=base_url):
        return list(OpenAIProvider().stream(ModelRequest(messages=MESSAGES)))


def test_a_run_threads_calls_go_over_one_kept_alive_connection(wire):
    server = wire(sse_answer("one"), sse_answer("two"), sse_answer("three"))

    answers = [call(server.base_url) for _ in range(3)]

    assert [a[0] for a in answers] == [TextDelta("one"), TextDelta("two"), TextDelta("three")]
    assert all(a[-1] == Finish("stop") for a in answers)
    assert server.targets == ["/v1/chat/completions"] * 3
    assert server.connections == 1


def test_a_connection_the_server_dropped_while_idle_is_replaced_before_the_next_call(wire):
    # Kept alive as far as the client knows, closed by the server after the answer (an idle timeout).
    server = wire(sse_answer("one") + WireServer.CLOSE, sse_answer("two"))

    first = call(server.base_url)
    second = call(server.base_url)

    assert first[0] == TextDelta("one") and second[0] == TextDelta("two")
    assert server.connections == 2


def test_a_connection_reset_before_any_answer_is_asked_once_more_on_a_new_one(wire):
    # What a server whose accept queue is full, or one closing a kept-alive connection as it is
    # reused, does: the call is asked again at once, not left to a backoff of the run.
    server = wire(WireServer.RESET, sse_answer("second try"))

    assert call(server.base_url)[0] == TextDelta("second try")
    assert server.connections == 2 and len(server.targets) == 2


def test_a_connection_reset_twice_is_a_transient_error(wire):
    server = wire(WireServer.RESET, WireServer.RESET)

    with pytest.raises(TransientModelError, match="model server unreachable"):
        call(server.base_url)
    assert server.connections == 2


def test_a_sized_body_cut_short_is_a_broken_stream_and_its_connection_is_not_reused(wire):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 400\r\n\r\n"
    cut = head + b'data: {"choices": [{"index": 0, "delta": {"content": "sun"}}]}\n\n' + WireServer.CLOSE
    server = wire(cut, sse_answer("after"))

    with pytest.raises(TransientModelError, match="model stream broken"):
        call(server.base_url)

    assert call(server.base_url)[0] == TextDelta("after")
    assert server.connections == 2


def test_a_chunked_body_cut_before_its_first_chunk_is_a_broken_stream(wire):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    server = wire(head + WireServer.CLOSE)

    with pytest.raises(TransientModelError, match="model stream broken"):
        call(server.base_url)


def moved_to_v2(server: WireServer) -> bytes:
    return (f"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:{server.port}/v2/chat/completions\r\n"
            "Content-Length: 0\r\n\r\n").encode()


def test_a_redirect_is_followed_with_the_same_request(wire):
    server = wire(moved_to_v2, moved_to_v2, sse_answer("moved"))

    assert call(server.base_url)[0] == TextDelta("moved")
    # Redirected, the call is asked through httpx where the redirect points (not at the first URL
    # again), and httpx follows a further redirect; each time the same POST, body and all.
    assert server.targets == ["/v1/chat/completions", "/v2/chat/completions", "/v2/chat/completions"]
    assert server.methods == ["POST"] * 3 and len(set(server.bodies)) == 1 and server.bodies[0]


@pytest.mark.parametrize("credential_header", ["authorization", "x-api-key"])
def test_a_redirect_to_another_origin_carries_no_credential(wire, credential_header):
    elsewhere = wire(sse_answer("elsewhere"), sse_answer("upgraded"))
    home = wire(
        f"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://localhost:{elsewhere.port}/v1/chat/completions\r\n"
        "Content-Length: 0\r\n\r\n".encode(),
        moved_to_v2, sse_answer("same origin"),
    )
    headers = {"Authorization": "Bearer sk-wire-secret-0123"} if credential_header == "authorization" else {
        "x-api-key": "sk-wire-secret-0123"}
    with override_settings(OPENAI_BASE_URL=home.base_url, OPENAI_API_KEY="sk-wire-secret-0123"):
        endpoint = endpoint_default()

    def ask(url: str) -> list:
        with provider_http.sse_post(endpoint=endpoint, url=url, body={"messages": MESSAGES}, headers=headers,
                                    timeout=10) as events:
            return list(events)

    assert ask(f"{home.base_url}/chat/completions")  # to another origin (127.0.0.1 → localhost)
    assert credential_header in home.headers[0] and credential_header not in elsewhere.headers[0]
    assert ask(f"{home.base_url}/chat/completions")  # the same origin: the credential goes along
    assert home.headers[2][credential_header] == home.headers[1][credential_header]


def see_other(server) -> bytes:
    return b"HTTP/1.1 303 See Other\r\nLocation: /v1/answers/7\r\nContent-Length: 0\r\n\r\n"


def test_a_see_other_redirect_is_followed_with_a_get_as_httpx_would(wire):
    server = wire(see_other, sse_answer("seen"))

    assert call(server.base_url)[0] == TextDelta("seen")
    assert server.targets == ["/v1/chat/completions", "/v1/answers/7"]
    assert server.methods == ["POST", "GET"] and server.bodies[1] == b""


def test_a_redirect_without_a_location_is_the_servers_error(wire):
    server = wire(b"HTTP/1.1 302 Found\r\nContent-Length: 0\r\n\r\n")

    with pytest.raises(PermanentModelError, match="302"):
        call(server.base_url)
    assert server.targets == ["/v1/chat/completions"]


def test_a_proxy_in_the_environment_is_not_taken(wire, monkeypatch):
    # Model servers are called directly, as they were through httpx (whose client, made with a
    # transport of its own, never read the environment's proxies).
    closed = socket.create_server(("127.0.0.1", 0))
    nowhere = closed.getsockname()[1]
    closed.close()
    server = wire(sse_answer("direct"), moved_to_v2, moved_to_v2, sse_answer("followed"))
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{nowhere}")
    monkeypatch.setenv("ALL_PROXY", f"http://127.0.0.1:{nowhere}")

    assert call(server.base_url)[0] == TextDelta("direct")
    assert call(server.base_url)[0] == TextDelta("followed")  # a redirect, followed through httpx
    assert server.targets == ["/v1/chat/completions"] * 2 + ["/v2/chat/completions"] * 2


def test_with_tracing_on_a_model_call_has_its_http_span_and_passes_the_trace_on(wire):
    exporter = InMemorySpanExporter()
    tracing_setup(exporter=exporter)
    try:
        server = wire(sse_answer("traced"))
        with span("model.call") as model_call:
            assert call(server.base_url)[0] == TextDelta("traced")
        trace_id = format(model_call.get_span_context().trace_id, "032x")
    finally:
        tracing_reset()

    (http,) = [s for s in exporter.get_finished_spans() if s.parent is not None
               and s.parent.span_id == model_call.get_span_context().span_id]
    assert http.attributes.get("http.request.method", http.attributes.get("http.method")) == "POST"
    assert server.headers[0]["traceparent"].split("-")[1] == trace_id


@pytest.mark.parametrize(("url", "location", "same"), [
    ("http://models.example/v1/chat", "/v2/chat", True),
    ("http://models.example/v1/chat", "http://MODELS.example:80/v2/chat", True),
    ("http://models.example/v1/chat", "https://models.example/v1/chat", True),  # httpx's one exception: the upgrade
    ("http://models.example/v1/chat", "https://models.example:8443/v1/chat", False),
    ("https://models.example/v1/chat", "http://models.example/v1/chat", False),  # a downgrade
    ("https://models.example/v1/chat", "https://other.example/v1/chat", False),
    ("http://models.example:8000/v1/chat", "http://models.example:8001/v1/chat", False),
])
def test_which_redirects_stay_at_the_origin(url, location, same):
    assert provider_http._redirect(url, 307, location).same_origin is same


def test_a_worker_streaming_its_model_calls_never_imports_the_openai_sdk(wire):
    # The SDK (~0.5 s of CPU and ~50 MB a process) is for the rare unstreamed calls; streaming, and
    # importing the engine and every provider, leave it unimported. In a process of its own, where
    # nothing else has imported it yet.
    server = wire(sse_answer("streamed"))
    script = (
        "import os, sys, django; django.setup()\n"
        "import engine.loop, engine.executor, runs_app.providers.openai as p, runs_app.providers.anthropic, "
        "runs_app.providers.responses\n"
        "from django.test import override_settings\n"
        "from runs_app.providers.base import ModelRequest\n"
        f"with override_settings(OPENAI_BASE_URL={server.base_url!r}):\n"
        "    events = list(p.OpenAIProvider().stream(ModelRequest(messages=[{'role': 'user', 'content': 'hi'}])))\n"
        "print(len(events), 'openai' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "WARDEN_DEMO": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["2", "False"]
