"""A Server-Sent Events client of a real web server the test started, read frame by frame, and the
writes a stream test makes to a waiting run as the engine makes them."""

import httpx
from django.db import transaction

from engine.state import run_transition, run_write
from runs_app.events import RunEventType
from runs_app.models import Run, RunStatus


def notes_append(run: Run, *notes: str) -> None:
    """Events committed the way the engine commits them (run_write), so the doorbell rings after commit."""
    with transaction.atomic():
        run_write(run_id=run.pk, events=[(RunEventType.INPUT_QUEUED, {"pending_input": 1, "mode": "queue", "content": note})
                                          for note in notes])


def run_end(run: Run) -> None:
    """The run ends (cancelled while it waits: a legal way out of its wait) through the state module."""
    with transaction.atomic():
        assert run_transition(run=Run.objects.get(pk=run.pk), to=RunStatus.CANCELLED)


class SseClient:
    """One SSE connection to `path` (under the server's root) with a bearer key; each frame a dict
    of its fields: {"id", "event", "data", "comment", "retry"}."""

    def __init__(self, base_url: str, path: str, key: str, headers: dict | None = None, **params):
        self._stream = httpx.stream("GET", f"{base_url}{path}", params=params, timeout=60, trust_env=False,
                                    headers={"Authorization": f"Bearer {key}", **(headers or {})})
        self.response = self._stream.__enter__()
        assert self.response.status_code == 200, self.response.read()
        assert self.response.headers["content-type"] == "text/event-stream"
        self._lines = self.response.iter_lines()
        self._open = True

    def frame(self) -> dict:
        fields: dict[str, str] = {}
        for line in self._lines:
            if line == "":
                if fields:
                    return fields
            elif line.startswith(":"):
                fields["comment"] = line[1:].strip()
            else:
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
        raise EOFError("the stream ended")

    def event_frame(self) -> dict:
        """The next frame that is not a keepalive."""
        while "comment" in (frame := self.frame()):
            pass
        return frame

    def close(self) -> None:
        """Drops the connection (the server sees the client go away)."""
        if self._open:
            self._open = False
            self._stream.__exit__(None, None, None)
