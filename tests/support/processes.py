"""Real processes for tests: the web server (daphne), the demo's simulated payment service (a
daphne of its own, as in `make run`), django-q2 worker clusters and the sweeper, all pointed at
the test database. Used where the behaviour is about processes."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

from django.db import connection

from tests.support.simulator import SIMULATOR_ASGI

ROOT = Path(__file__).resolve().parents[2]
LOG_DIR = ROOT / "test-artifacts" / "process-logs"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_database_url() -> str:
    """The URL of the database the tests use (pytest-django's test_… database)."""
    s = connection.settings_dict
    host = s.get("HOST") or ""
    host = quote(host, safe="") if host.startswith("/") else host
    port = f":{s['PORT']}" if s.get("PORT") else ""
    password = f":{quote(s['PASSWORD'])}" if s.get("PASSWORD") else ""
    return f"postgresql://{quote(s.get('USER') or 'postgres')}{password}@{host}{port}/{s['NAME']}"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(predicate, *, timeout: float = 60.0, interval: float = 0.1, message: str = "condition"):
    """Poll until `predicate()` is truthy. The timeout only bounds a hung test; nothing here
    asserts how long anything took."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {message}")
        time.sleep(interval)


class ProcessGroup:
    """Starts and stops the processes of one test; everything is killed at the end."""

    def __init__(self, *, name: str, env: dict[str, str] | None = None):
        self.name = name
        self.port = free_port()
        self.sim_port = free_port()
        self.base_env = {
            **os.environ,
            "DATABASE_URL": test_database_url(),
            "WARDEN_SIM_BASE_URL": f"http://127.0.0.1:{self.sim_port}/sim",
            # The server's own origin is the one trusted to post and to open the console's socket.
            "CSRF_TRUSTED_ORIGINS": f"http://127.0.0.1:{self.port}",
            "WARDEN_LEASE_SECONDS": "4",
            "WARDEN_HEARTBEAT_SECONDS": "0.5",
            "WARDEN_SWEEP_SECONDS": "0.5",
            "WARDEN_SCRIPTED_DELAY_SECONDS": "0.005",
            "WARDEN_SLICE_SECONDS": "30",
            "WARDEN_RETRY_BASE_SECONDS": "0.1",
            "WARDEN_Q_POLL": "0.05",
            "WARDEN_ALLOW_FAULTS": "1",
            "WARDEN_RECONCILE_GRACE_SECONDS": "2",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.processes: dict[str, subprocess.Popen] = {}
        LOG_DIR.mkdir(parents=True, exist_ok=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, label: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(LOG_DIR / f"{self.name}-{label}.log", "ab")
        process = subprocess.Popen(
            argv, cwd=ROOT, env={**self.base_env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so the whole cluster can be signalled
        )
        self.processes[label] = process
        return process

    def start_web(self, *, simulator: bool = True) -> subprocess.Popen:
        """The web server; with it, as in `make run`, the simulated payment service the demo tools call."""
        process = self.start("web", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "server.asgi:application"])
        if simulator:
            self.start_sim()
        wait_for(lambda: self._listening(self.port), timeout=60, message="the web server to accept connections")
        return process

    def start_sim(self) -> subprocess.Popen:
        """The simulated payment service's own application (demo/asgi.py) on its own port."""
        process = self.start("sim", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.sim_port), SIMULATOR_ASGI])
        wait_for(lambda: self._listening(self.sim_port), timeout=60, message="the simulated payment service to accept connections")
        return process

    @staticmethod
    def _listening(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    def start_workers(self, label: str = "workers", *, workers: int = 1, env: dict[str, str] | None = None) -> subprocess.Popen:
        return self.start(label, [sys.executable, "manage.py", "qcluster"], env={"WARDEN_WORKERS": str(workers), **(env or {})})

    def start_sweeper(self, interval: float = 0.5) -> subprocess.Popen:
        return self.start("sweeper", [sys.executable, "manage.py", "sweep", "--loop", "--interval", str(interval)])

    def signal(self, label: str, sig: int) -> None:
        process = self.processes[label]
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, label: str) -> None:
        """Kill the process and its whole group at once (SIGKILL: a stopped process too). What a test
        starts is disposable, and no assertion depends on a graceful stop — which, sent to a whole
        django-q2 cluster group, can even deadlock its parent (a signalled sentinel dies while the
        parent waits to notify it). A test of stopping uses `terminate`."""
        process = self.processes.pop(label, None)
        if process is None:
            return
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()

    def terminate(self, label: str, *, sig: int | None = None) -> int:
        """Stop the process as an operator would (`sig`, default SIGTERM, to the group's leader only),
        and wait until no process of its group is left; returns its exit status."""
        process = self.processes.pop(label)
        process.send_signal(sig or signal.SIGTERM)
        status = process.wait()
        wait_for(lambda: not _group_alive(process.pid), timeout=60, message=f"every process of {label} to end")
        return status

    def stop_all(self) -> None:
        for label in list(self.processes):
            self.stop(label)
        connection.close()
