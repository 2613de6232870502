"""The reference MCP payments server (tests/support/mcp_payments.py) as a real process for tests.

    with McpPaymentsServer(token="s3cret") as server:
        server.url          # http://127.0.0.1:PORT/mcp  (the MCP endpoint, streamable HTTP)
        server.set_mode("hang_after_booking", seconds=5)
        ...
        server.calls(tool="refund")   # what the provider saw
        server.bookings()             # {idempotency key: refund}

or, in a test, the `mcp_payments_server` fixture (import it into the test module or a conftest).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOG_DIR = ROOT / "test-artifacts" / "process-logs"
START_TIMEOUT = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class McpPaymentsServer:
    """Starts `python -m tests.support.mcp_payments --port N [--token T]` and stops it again.

    Usable as a context manager or through `start()` / `stop()`. The control helpers talk to the
    server's plain-HTTP control routes (no auth needed)."""

    def __init__(self, token: str | None = None, *, port: int | None = None, start_timeout: float = START_TIMEOUT):
        self.token = token
        self.port = port or _free_port()
        self.host = "127.0.0.1"
        self.base_url = f"http://{self.host}:{self.port}"
        self.url = f"{self.base_url}/mcp"
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = LOG_DIR / f"mcp-payments-{self.port}.log"

    # ---- lifecycle

    def start(self) -> McpPaymentsServer:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "tests.support.mcp_payments", "--port", str(self.port), "--host", self.host]
        if self.token is not None:
            cmd += ["--token", self.token]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"mcp_payments exited with {self.process.returncode}: {self.log_tail()}")
            try:
                self.state()
                return self
            except (OSError, urllib.error.URLError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"mcp_payments did not answer within {self.start_timeout}s: {self.log_tail()}")
                time.sleep(0.05)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def __enter__(self) -> McpPaymentsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # ---- MCP client conveniences

    @property
    def headers(self) -> dict[str, str]:
        """The headers an authorized client sends (the bearer token, when the server has one)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token is not None else {}

    # ---- control routes

    def _control(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.base_url}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - our own localhost server
            return json.loads(response.read())

    def state(self) -> dict[str, Any]:
        """{"bookings": {key: refund}, "unkeyed_bookings": [...], "calls": [...], "mode", "seconds", "variant"}."""
        return self._control("GET", "/control/state")

    def set_mode(self, mode: str, seconds: float | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"mode": mode}
        if seconds is not None:
            body["seconds"] = seconds
        return self._control("POST", "/control/mode", body)

    def set_variant(self, variant: str) -> dict[str, Any]:
        return self._control("POST", "/control/variant", {"variant": variant})

    def reset(self) -> dict[str, Any]:
        return self._control("POST", "/control/reset", {})

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        calls = self.state()["calls"]
        return calls if tool is None else [call for call in calls if call["tool"] == tool]

    def bookings(self) -> dict[str, dict[str, Any]]:
        return self.state()["bookings"]


@pytest.fixture
def mcp_payments_server(request: pytest.FixtureRequest):
    """A fresh reference payments server for one test. Its token comes from
    `@pytest.mark.parametrize("mcp_payments_server", ["tok"], indirect=True)` (default: none)."""
    token = getattr(request, "param", None)
    with McpPaymentsServer(token=token) as server:
        yield server
