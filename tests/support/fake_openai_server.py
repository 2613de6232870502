"""A local OpenAI-compatible Chat Completions server that speaks the real wire format.

`POST /v1/chat/completions` answers with `text/event-stream` (chunked, `data: {chunk}` lines,
`data: [DONE]`) when `stream` is true, else with a `chat.completion` object. Tests program it
with a queue of responses (`enqueue`); when the queue is empty and `fallback="scripted"`, it
answers with the scripted provider's rules, so whole runs work through the openai provider.

    with FakeOpenAIServer() as server:
        server.enqueue(text=["Hel", "lo"], finish="stop")
        server.enqueue(tool_calls=[{"id": "call_1", "name": "query_order",
                                    "arguments_chunks": ['{"order_', 'id": "9527"}']}],
                       finish="tool_calls")
        server.enqueue(status=429, headers={"Retry-After": "1"})
        server.enqueue(text=["a", "b", "c"], disconnect_after=2)  # socket closed mid-stream

As a process (scripted fallback; for end-to-end tests):

    python -m tests.support.fake_openai_server --port 8765 [--delay 0.02]

A separate process is programmed over HTTP: `POST /_fake/enqueue` with the `enqueue` keyword
arguments as JSON, `GET /_fake/requests`, `POST /_fake/reset`.

Beside each request's body (`requests`) the server keeps the Authorization header it came with
(`authorizations`, same order; "" when there was none), so a test can tell which key was used.
"""

import argparse
import collections
import itertools
import json
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterable, Iterator

from runs_app.providers.base import (
    Finish,
    ModelError,
    ModelRequest,
    PermanentModelError,
    TextDelta,
    ToolCallDelta,
    TransientModelError,
    Usage,
)
from demo.model import DemoModel
from runs_app.providers.rules import classify_input_by_rules

COMPLETIONS_PATH = "/v1/chat/completions"
_DROP = object()  # in a chunk sequence: close the socket here, without [DONE]


class Outcome:
    COMPLETED = "completed"  # the whole response was written
    CLIENT_DISCONNECTED = "client_disconnected"  # a write failed: the client went away
    DROPPED = "dropped"  # the server closed the socket mid-stream on purpose
    ERROR_STATUS = "error_status"  # answered with an HTTP error


@dataclass
class QueuedResponse:
    text: list[str] = field(default_factory=list)
    tool_calls: list[dict] = field(default_factory=list)
    finish: str | None = "stop"
    status: int = 200
    headers: dict = field(default_factory=dict)
    error_message: str = ""
    disconnect_after: int | None = None
    chunk_delay: float = 0.0
    interleave: bool = False
    usage: dict | None = None


class FakeOpenAIServer:
    def __init__(
        self,
        *,
        fallback: str | None = None,
        scripted_delay: float = 0.0,
        scripted_options: dict | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        if fallback not in (None, "scripted"):
            raise ValueError("fallback must be None or 'scripted'")
        self.fallback = fallback
        self.scripted_delay = scripted_delay
        # Passed to the scripted provider as ModelRequest.options (e.g. {"faults": [...]}); its
        # call_index counts the requests this server answered by the scripted rules.
        self.scripted_options = dict(scripted_options or {})
        self.requests: list[dict] = []
        self.authorizations: list[str] = []
        self.outcomes: dict[int, str] = {}
        self._queue: collections.deque[QueuedResponse] = collections.deque()
        self._scripted_calls = itertools.count()
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._released = threading.Event()  # ends every chunk_delay pause at once (release_held)
        self._httpd = _HTTPServer((host, port), _Handler)
        self._httpd.fake = self
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> "FakeOpenAIServer":
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-openai", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread:
            self._thread.join(timeout=5)

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        host = self._httpd.server_address[0]
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{self.port}/v1"

    # --- programming and inspecting ----------------------------------------------------------

    def enqueue(
        self,
        *,
        text: list[str] | None = None,
        tool_calls: list[dict] | None = None,
        finish: str | None = "stop",
        status: int = 200,
        headers: dict | None = None,
        error_message: str = "",
        disconnect_after: int | None = None,
        chunk_delay: float = 0.0,
        interleave: bool = False,
        usage: dict | None = None,
    ) -> None:
        """Queue the answer to the next request.

        text: content pieces, one chunk each. tool_calls: [{"id", "name", "arguments_chunks":
        [...]} or "arguments": "..."; optional "index"]; each call's first chunk carries id, type
        and name with empty arguments, then one chunk per argument piece; `interleave` alternates
        the calls' chunks. finish: the finish_reason (None: no finish chunk). status != 200: an
        OpenAI-style JSON error with `headers`. disconnect_after: close the socket after that
        many data chunks, without [DONE]. chunk_delay: pause before each chunk. usage:
        {"prompt_tokens", "completion_tokens"} (default: rough counts).
        """
        response = QueuedResponse(
            text=list(text or []),
            tool_calls=list(tool_calls or []),
            finish=finish,
            status=status,
            headers=dict(headers or {}),
            error_message=error_message,
            disconnect_after=disconnect_after,
            chunk_delay=chunk_delay,
            interleave=interleave,
            usage=usage,
        )
        with self._changed:
            self._queue.append(response)

    def release_held(self) -> None:
        """End every `chunk_delay` pause now and from now on: held responses go on at once."""
        self._released.set()

    def in_flight(self) -> int:
        """Requests received whose response is not written yet."""
        with self._changed:
            return len(self.requests) - len(self.outcomes)

    def request_number(self, text: str) -> int | None:
        """The number of the first request whose messages contain `text`."""
        with self._changed:
            return next((n for n, body in enumerate(self.requests) if text in json.dumps(body.get("messages"))), None)

    def reset(self) -> None:
        with self._changed:
            self._queue.clear()
            self.requests.clear()
            self.authorizations.clear()
            self.outcomes.clear()
            self._scripted_calls = itertools.count()

    @property
    def client_disconnects(self) -> list[int]:
        """Numbers of the requests whose client went away before the response was written."""
        return [number for number, outcome in self.outcomes.items() if outcome == Outcome.CLIENT_DISCONNECTED]

    def wait_for_outcome(self, number: int, *, timeout: float = 10.0) -> str | None:
        """The outcome of request `number` once it has one; None if it has none by `timeout`."""
        with self._changed:
            self._changed.wait_for(lambda: number in self.outcomes, timeout=timeout)
            return self.outcomes.get(number)

    # --- serving -----------------------------------------------------------------------------

    def _record_request(self, body: dict, authorization: str = "") -> int:
        with self._changed:
            self.requests.append(body)
            self.authorizations.append(authorization)
            return len(self.requests) - 1

    def _record_outcome(self, number: int, outcome: str) -> None:
        with self._changed:
            self.outcomes[number] = outcome
            self._changed.notify_all()

    def _next_queued(self) -> QueuedResponse | None:
        with self._changed:
            return self._queue.popleft() if self._queue else None

    def _answer_completion(self, handler: "_Handler", body: dict) -> None:
        number = self._record_request(body, handler.headers.get("Authorization") or "")
        queued = self._next_queued()
        writer = _ResponseWriter(handler, body=body, stopping=self._stopping, released=self._released)
        if queued is None and self.fallback != "scripted":
            outcome = writer.error(500, "fake OpenAI server: no response queued", {})
        elif queued is not None and queued.status != 200:
            outcome = writer.error(queued.status, queued.error_message or f"status {queued.status}", queued.headers)
        elif queued is not None and body.get("stream"):
            outcome = writer.stream(_queued_chunks(queued, body, writer), delay=queued.chunk_delay)
        elif queued is not None:
            outcome = writer.json(200, _queued_completion(queued, body, writer))
        elif body.get("stream"):
            outcome = writer.stream(self._scripted_chunks(body, writer), delay=0.0)
        else:
            outcome = self._scripted_completion(body, writer)
        self._record_outcome(number, outcome)

    def _scripted_request(self, body: dict) -> ModelRequest:
        options = {"delay": self.scripted_delay, **self.scripted_options}
        return ModelRequest(
            messages=body.get("messages", []),
            tools=body.get("tools", []),
            run_id="fake-openai",
            call_index=next(self._scripted_calls),
            options=options,
        )

    def _scripted_chunks(self, body: dict, writer: "_ResponseWriter") -> Iterator:
        usage = None
        try:
            for event in DemoModel().stream(self._scripted_request(body)):
                if isinstance(event, TextDelta):
                    yield writer.chunk({"content": event.text})
                elif isinstance(event, ToolCallDelta):
                    yield writer.chunk({"tool_calls": [_tool_call_delta(event)]})
                elif isinstance(event, Usage):
                    usage = {"prompt_tokens": event.input_tokens, "completion_tokens": event.output_tokens}
                elif isinstance(event, Finish):
                    yield writer.chunk({}, finish=event.reason)
        except TransientModelError:
            if writer.started:
                yield _DROP  # the scripted "disconnect" fault: a dropped stream
                return
            raise
        if usage and writer.include_usage:
            yield writer.usage_chunk(usage)

    def _scripted_completion(self, body: dict, writer: "_ResponseWriter") -> str:
        classification = _classification_question(body)
        if classification is not None:
            answer = classify_input_by_rules(**classification)
            content = json.dumps({"mode": answer.mode, "reason": answer.reason})
            return writer.json(200, writer.completion({"role": "assistant", "content": content}, "stop", None))
        text, calls, finish, usage = [], {}, None, None
        try:
            for event in DemoModel().stream(self._scripted_request(body)):
                if isinstance(event, TextDelta):
                    text.append(event.text)
                elif isinstance(event, ToolCallDelta):
                    call = calls.setdefault(event.index, {"id": event.id, "name": event.name, "arguments": ""})
                    call["arguments"] += event.arguments
                elif isinstance(event, Usage):
                    usage = {"prompt_tokens": event.input_tokens, "completion_tokens": event.output_tokens}
                elif isinstance(event, Finish):
                    finish = event.reason
        except ModelError as error:
            return writer.model_error(error)
        message = _message("".join(text), [calls[index] for index in sorted(calls)])
        return writer.json(200, writer.completion(message, finish, usage))


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeOpenAIServer

    def handle_error(self, request, client_address):
        # Clients dropping idle keep-alive connections is normal, not worth a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked streaming, as the real API uses

    def log_message(self, format, *args):  # keep test output quiet
        pass

    @property
    def fake(self) -> FakeOpenAIServer:
        return self.server.fake

    def do_POST(self):
        body = self._read_json()
        if body is None:
            return
        if self.path == COMPLETIONS_PATH:
            self.fake._answer_completion(self, body)
        elif self.path == "/_fake/enqueue":
            self.fake.enqueue(**body)
            _ResponseWriter(self, body={}, stopping=self.fake._stopping).json(200, {"queued": True})
        elif self.path == "/_fake/reset":
            self.fake.reset()
            _ResponseWriter(self, body={}, stopping=self.fake._stopping).json(200, {"reset": True})
        else:
            _ResponseWriter(self, body={}, stopping=self.fake._stopping).error(404, f"no route {self.path}", {})

    def do_GET(self):
        writer = _ResponseWriter(self, body={}, stopping=self.fake._stopping)
        if self.path == "/_fake/requests":
            writer.json(200, {"requests": self.fake.requests, "outcomes": self.fake.outcomes,
                              "authorizations": self.fake.authorizations})
        else:
            writer.error(404, f"no route {self.path}", {})

    def _read_json(self) -> dict | None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            _ResponseWriter(self, body={}, stopping=self.fake._stopping).error(400, "body must be a JSON object", {})
            return None
        return body


class _ResponseWriter:
    """Writes one response in OpenAI's shapes; every method returns an Outcome value."""

    def __init__(self, handler: _Handler, *, body: dict, stopping: threading.Event,
                 released: threading.Event | None = None):
        self.handler = handler
        self.model = body.get("model") or "fake-model"
        self.include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in body.get("messages", []))
        self.completion_id = f"chatcmpl-fake{id(self):x}"
        self.created = int(time.time())
        self.started = False
        self._role_sent = False
        self._stopping = stopping
        self._released = released or threading.Event()

    # shapes

    def chunk(self, delta: dict, *, finish: str | None = None) -> dict:
        if not self._role_sent and finish is None:
            delta = {"role": "assistant", **delta}
            self._role_sent = True
        chunk = self._envelope("chat.completion.chunk")
        chunk["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def usage_chunk(self, usage: dict) -> dict:
        chunk = self._envelope("chat.completion.chunk")
        chunk["choices"] = []
        chunk["usage"] = _usage(usage)
        return chunk

    def completion(self, message: dict, finish: str | None, usage: dict | None) -> dict:
        completion = self._envelope("chat.completion")
        completion["choices"] = [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}]
        completion["usage"] = _usage(usage or {"prompt_tokens": self.prompt_tokens, "completion_tokens": 1})
        return completion

    def _envelope(self, kind: str) -> dict:
        return {
            "id": self.completion_id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_fake",
        }

    # writing

    def json(self, status: int, payload: dict, headers: dict | None = None) -> str:
        data = json.dumps(payload).encode()
        try:
            self.handler.send_response(status)
            self.handler.send_header("Content-Type", "application/json")
            self.handler.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.handler.send_header(name, str(value))
            self.handler.end_headers()
            self.handler.wfile.write(data)
        except OSError:
            self.handler.close_connection = True
            return Outcome.CLIENT_DISCONNECTED
        return Outcome.COMPLETED if status < 400 else Outcome.ERROR_STATUS

    def error(self, status: int, message: str, headers: dict) -> str:
        kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}.get(status)
        kind = kind or ("rate_limit_error" if status == 429 else "server_error" if status >= 500 else "api_error")
        payload = {"error": {"message": message, "type": kind, "param": None, "code": None}}
        return self.json(status, payload, headers)

    def model_error(self, error: ModelError) -> str:
        headers = {}
        if isinstance(error, TransientModelError) and error.retry_after is not None:
            headers["Retry-After"] = str(error.retry_after)
        default = 400 if isinstance(error, PermanentModelError) else 500
        return self.error(error.status or default, str(error), headers)

    def stream(self, chunks: Iterable, *, delay: float) -> str:
        iterator = iter(chunks)
        try:
            first = next(iterator, None)
        except ModelError as error:  # the scripted model failed before its first event
            return self.model_error(error)
        try:
            self.handler.send_response(200)
            self.handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.handler.send_header("Cache-Control", "no-cache")
            self.handler.send_header("Transfer-Encoding", "chunked")
            self.handler.end_headers()
            self.started = True
            for chunk in itertools.chain([first] if first is not None else [], iterator):
                if delay and not self._pause(delay):
                    self.handler.close_connection = True
                    return Outcome.CLIENT_DISCONNECTED
                if chunk is _DROP or self._stopping.is_set():
                    return self._drop()
                self._write_event(json.dumps(chunk))
            self._write_event("[DONE]")
            self.handler.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.handler.close_connection = True
            return Outcome.CLIENT_DISCONNECTED
        return Outcome.COMPLETED

    def _pause(self, seconds: float) -> bool:
        """Wait before a chunk, as a slow model does; False as soon as the client goes away (its
        end of the socket closed), so a test sees a dropped stream when it is dropped."""
        ends = time.monotonic() + seconds
        sock = self.handler.connection
        while not self._released.is_set() and (left := ends - time.monotonic()) > 0:
            readable, _, _ = select.select([sock], [], [], min(left, 0.05))
            if readable:
                try:
                    if not sock.recv(1, socket.MSG_PEEK):
                        return False
                except OSError:
                    return False
        return True

    def _write_event(self, data: str) -> None:
        payload = f"data: {data}\n\n".encode()
        self.handler.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")

    def _drop(self) -> str:
        # No terminating zero-length chunk: the client sees the body end mid-stream.
        self.handler.close_connection = True
        try:
            self.handler.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        return Outcome.DROPPED


def _queued_chunks(queued: QueuedResponse, body: dict, writer: _ResponseWriter) -> list:
    chunks = [writer.chunk({"content": piece}) for piece in queued.text]
    fragment_lists = [_tool_call_fragments(position, call) for position, call in enumerate(queued.tool_calls)]
    if queued.interleave:
        fragments = [f for group in itertools.zip_longest(*fragment_lists) for f in group if f is not None]
    else:
        fragments = [fragment for fragments in fragment_lists for fragment in fragments]
    chunks += [writer.chunk({"tool_calls": [fragment]}) for fragment in fragments]
    if not chunks:
        chunks.append(writer.chunk({"content": ""}))
    if queued.finish is not None:
        chunks.append(writer.chunk({}, finish=queued.finish))
    if writer.include_usage:
        usage = queued.usage or {"prompt_tokens": writer.prompt_tokens, "completion_tokens": len(chunks)}
        chunks.append(writer.usage_chunk(usage))
    if queued.disconnect_after is not None:
        chunks = chunks[: queued.disconnect_after] + [_DROP]
    return chunks


def _tool_call_fragments(position: int, call: dict) -> list[dict]:
    """`"index": None` leaves the index out of every fragment, as older Ollama and Gemini's
    compatible endpoint do."""
    index = call.get("index", position)
    pieces = call.get("arguments_chunks")
    if pieces is None:
        pieces = [call.get("arguments", "")]
    where = {} if index is None else {"index": index}
    head = {
        **where,
        "id": call.get("id", f"call_{position}"),
        "type": "function",
        "function": {"name": call["name"], "arguments": ""},
    }
    return [head] + [{**where, "function": {"arguments": piece}} for piece in pieces]


def _queued_completion(queued: QueuedResponse, body: dict, writer: _ResponseWriter) -> dict:
    calls = []
    for position, call in enumerate(queued.tool_calls):
        arguments = call.get("arguments")
        if arguments is None:
            arguments = "".join(call.get("arguments_chunks") or [])
        calls.append({"id": call.get("id", f"call_{position}"), "name": call["name"], "arguments": arguments})
    return writer.completion(_message("".join(queued.text), calls), queued.finish, queued.usage)


def _message(text: str, calls: list[dict]) -> dict:
    message = {"role": "assistant", "content": text or None, "refusal": None}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls
        ]
    return message


def _tool_call_delta(event: ToolCallDelta) -> dict:
    function = {"arguments": event.arguments}
    if event.name is not None:
        function["name"] = event.name
    delta = {"index": event.index, "function": function}
    if event.id is not None:
        delta.update(id=event.id, type="function")
    return delta


def _usage(usage: dict) -> dict:
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _classification_question(body: dict) -> dict | None:
    """The openai provider's classify_input sends {"history", "new_input"} as the last user
    message; answer it by the scripted rules."""
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    try:
        question = json.loads(users[-1]["content"]) if users else None
    except (TypeError, ValueError):
        return None
    if not isinstance(question, dict) or "new_input" not in question:
        return None
    return {"history": question.get("history") or [], "text": str(question["new_input"])}


def main() -> None:
    parser = argparse.ArgumentParser(description="A local OpenAI-compatible server (scripted fallback).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0, help="pause between scripted chunks, seconds")
    arguments = parser.parse_args()
    server = FakeOpenAIServer(
        fallback="scripted", scripted_delay=arguments.delay, host=arguments.host, port=arguments.port
    )
    server.start()
    print(f"fake OpenAI server listening on {server.base_url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
