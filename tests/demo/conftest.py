import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.processes import test_database_url
from tests.support.simulator import SIMULATOR_ASGI
from django.db import connection
from django.test import override_settings

from tools_app.registry import ToolContext

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sim_url(simulator):
    """The simulated service on its own in-process server, where the demo tools look for it."""
    return simulator


@pytest.fixture
def sim_client(sim_url):
    with httpx.Client(base_url=sim_url, timeout=10, trust_env=False) as client:
        yield client


@pytest.fixture
def tool_ctx():
    def make(*, idempotency_key: str | None = "refund-key-1", timeout: float = 5.0) -> ToolContext:
        return ToolContext(
            run_id="run-1", session_id="session-1", tool_call_id="tool-call-1",
            idempotency_key=idempotency_key, timeout=timeout,
        )

    return make


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def closed_port_url():
    """A base URL nobody listens on: connecting is refused, so no request ever leaves."""
    url = f"http://127.0.0.1:{_free_port()}/sim"
    with override_settings(WARDEN_SIM_BASE_URL=url):
        yield url


@pytest.fixture
def concurrently():
    """Run `fn` in `n` threads released together; returns their results (or exceptions)."""

    def run(fn, n: int) -> list:
        barrier = threading.Barrier(n)
        results: list = [None] * n

        def worker(i: int):
            try:
                barrier.wait()
                results[i] = fn(i)
            except Exception as exc:  # collected for the test to inspect
                results[i] = exc
            finally:
                connection.close()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return results

    return run


@pytest.fixture
def daphne_sim(transactional_db, tmp_path):
    """The simulated service's own ASGI application served by a real daphne process on a free
    port, on the test database; the demo tools point at its /sim. The process is killed afterwards."""
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": test_database_url()}
    log = (tmp_path / "daphne.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), SIMULATOR_ASGI],
        cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/sim"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"daphne exited early:\n{(tmp_path / 'daphne.log').read_text()}")
            try:
                if httpx.get(f"{url}/weather", params={"city": "ready"}, timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"daphne did not start:\n{(tmp_path / 'daphne.log').read_text()}")
            time.sleep(0.1)
        with override_settings(WARDEN_SIM_BASE_URL=url):
            yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
