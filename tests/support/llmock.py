"""LLMock (a third-party chaos server for LLM clients, installed with the test extras) as a process of
its own, shared by a test module: it speaks OpenAI Chat Completions and Responses (`/v1/…`) and
Anthropic Messages (`/anthropic/v1/messages`). Tests queue behaviours with `scenario(...)`
(`/_llmock/scenario`: replies, tool calls, HTTP failures, stream faults — llmock/scenarios.py),
read what it received with `requests(...)` (`/_llmock/requests`), and `reset()` between tests."""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from runs_app.endpoints import Endpoint
from runs_app.providers.base import ToolCallDelta
from tests.support.processes import LOG_DIR, ROOT, free_port, wait_for

RESPONSES_PATH = "/v1/responses"
ANTHROPIC_PATH = "/anthropic/v1/messages"


class LLMock:
    def __init__(self):
        self.port = free_port()
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", trust_env=False, timeout=10)
        self.process: subprocess.Popen | None = None

    # The base URL of an endpoint of each kind (the providers add /responses, /v1/messages).
    @property
    def openai_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/anthropic"

    def start(self) -> "LLMock":
        executable = shutil.which("llmock", path=str(Path(sys.executable).parent))
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        with open(LOG_DIR / "llmock.log", "ab") as log:
            self.process = subprocess.Popen(
                [executable, "serve", "--host", "127.0.0.1", "--port", str(self.port), "--tool-mode", "off",
                 "--response-style", "static"],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self._up, timeout=60, message="LLMock to answer")
        return self

    def stop(self) -> None:
        self.client.close()
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def _up(self) -> bool:
        try:
            return self.client.get("/health").status_code == 200
        except httpx.HTTPError:
            return False

    def reset(self) -> None:
        assert self.client.post("/_llmock/reset").status_code == 200

    def scenario(self, *behaviors: dict) -> None:
        assert self.client.post("/_llmock/scenario", json={"behaviors": list(behaviors)}).status_code == 201

    def requests(self, path: str | None = None, *, model: str | None = None) -> list[dict]:
        """What it received (oldest first), of one path and model when given."""
        return [r for r in self.client.get("/_llmock/requests").json()["requests"]
                if (path is None or r["path"] == path) and (model is None or r.get("model") == model)]


def reply(*calls: tuple[str, dict], text: str | None = None, finish: str | None = None, model: str | None = None,
          times: int | None = 1) -> dict:
    """A scripted answer: text and/or tool calls (name, arguments), for requests of `model` when given."""
    behavior: dict = {"type": "reply", "times": times}
    if text is not None:
        behavior["text"] = text
    if calls:
        behavior["tool_calls"] = [{"name": name, "arguments": arguments} for name, arguments in calls]
    if finish:
        behavior["finish_reason"] = finish
    if model:
        behavior["match"] = {"model": model}
    return behavior


def fail(status: int, *, retry_after: float | None = None, model: str | None = None, times: int | None = 1) -> dict:
    behavior: dict = {"type": "fail", "status": status, "times": times}
    if retry_after is not None:
        behavior["retry_after"] = retry_after
    if model:
        behavior["match"] = {"model": model}
    return behavior


def stream_fault(kind: str, *, after_chunks: int, model: str | None = None) -> dict:
    """`disconnect` (the connection dropped), `truncate` (the body ends early, cleanly) or `malformed`
    (an event's JSON cut in half) at the event numbered `after_chunks` (0: the first)."""
    return {"type": "stream_fault", "kind": kind, "after_chunks": after_chunks,
            "match": {"stream": True, **({"model": model} if model else {})}}


def endpoint_for(kind: str, base_url: str, *, credential: str = "sk-test-credential-0001", model: str = "mock-model"):
    """An endpoint as a worker reads it (runs_app.endpoints.Endpoint), slots of its own."""
    return Endpoint(slots=f"test:{kind}:{base_url}", name=f"test-{kind}", kind=kind, base_url=base_url,
                    credential=credential, model=model, max_concurrency=4, timeout_seconds=10,
                    connect_timeout_seconds=5)


def drain(provider, request) -> tuple[list, Exception | None]:
    """Every event a provider's stream gave, and the error it ended with (None: it ended well)."""
    events = []
    try:
        for event in provider.stream(request):
            events.append(event)
    except Exception as error:  # the test asserts which
        return events, error
    return events, None


def assembled_calls(events) -> list[dict]:
    """The tool calls the fragments of `events` make, in order of their index."""
    calls: dict[int, dict] = {}
    for event in events:
        if isinstance(event, ToolCallDelta):
            call = calls.setdefault(event.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = call["id"] or event.id
            call["name"] = call["name"] or event.name
            call["arguments"] += event.arguments
    return [calls[index] for index in sorted(calls)]
