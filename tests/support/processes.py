"""Real processes for tests: the web server (daphne), the demo's simulated payment service (a
daphne of its own, as in `make run`), django-q2 worker clusters and the sweeper, all pointed at
the test database. Used where the behaviour is about processes.

Booting a server costs seconds of CPU (Django, Channels, ninja, OpenTelemetry), so the web servers
and the simulator are shared by the tests of a session (`SharedServers`): a test that starts a web
server with the same environment as an earlier one gets that one back, told to forget what it
cached (tests/support/shared_server.py), and between tests it is stopped (SIGSTOP) so that it
does nothing while the database is flushed and the next test runs without it. Workers and the
sweeper are the test's own, started with the environment it chose, and killed when it ends."""

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import OrderedDict
from dataclasses import dataclass
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


def free_port_pair() -> int:
    """A free port whose successor is free too (serve_all puts the simulator on port + 1)."""
    for _ in range(50):
        port = free_port()
        try:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no two consecutive free ports")


def test_database_url() -> str:
    """The URL of the database the tests use (pytest-django's test_… database)."""
    s = connection.settings_dict
    host = s.get("HOST") or ""
    host = quote(host, safe="") if host.startswith("/") else host
    port = f":{s['PORT']}" if s.get("PORT") else ""
    password = f":{quote(s['PASSWORD'])}" if s.get("PASSWORD") else ""
    return f"postgresql://{quote(s.get('USER') or 'postgres')}{password}@{host}{port}/{s['NAME']}"


def _parents() -> dict[int, int]:
    """Every process's parent, from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        # "pid (comm) state ppid …": the command may hold spaces and parentheses.
        found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def descendants(root: int) -> set[int]:
    """The processes `root` started, and theirs — wherever their process groups are."""
    parents = _parents()
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


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


def _spawn(label: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = open(LOG_DIR / f"{label}.log", "ab")
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so the whole cluster can be signalled
    )


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _daphne(port: int, application: str) -> list[str]:
    return [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), application]


@dataclass
class SharedServer:
    process: subprocess.Popen
    port: int
    application_name: str  # its database connections' (PGAPPNAME): what pause() watches


# A shared server's connections give up a transaction left open longer than this (one stopped
# mid-transaction between tests would otherwise hold the flush of the test database forever).
_SHARED_ENV = {"PGOPTIONS": "-c idle_in_transaction_session_timeout=5000"}


class SharedServers:
    """The web servers and the simulator the tests of one session share. Web servers are kept by
    the environment they were started with (at most `capacity`, least recently used one killed
    first); there is one simulator, which reads nothing but the database and fault settings."""

    def __init__(self, capacity: int = 3):
        self.capacity = capacity
        self.token = secrets.token_hex(16)
        self.sim_port = free_port()
        self.sim: SharedServer | None = None
        self.web: OrderedDict[tuple, SharedServer] = OrderedDict()
        self._started = 0

    def web_server(self, env: dict[str, str]) -> SharedServer:
        """The running server started with `env` (resumed and told to forget its caches), or a new one."""
        key = tuple(sorted((k, v) for k, v in env.items() if k not in ("CSRF_TRUSTED_ORIGINS", "PYTEST_CURRENT_TEST")))
        server = self.web.pop(key, None)
        if server is not None and self._resume(server):
            self.web[key] = server
            return server
        if server is not None:
            self._kill(server)
        while len(self.web) >= self.capacity:
            self._kill(self.web.popitem(last=False)[1])
        port = free_port()
        self._started += 1
        name = env.get("PGAPPNAME") or f"shared-web-{self._started}"
        process = _spawn(f"shared-web-{self._started}", _daphne(port, "server.asgi:application"), {
            "PGAPPNAME": name, **env, **_SHARED_ENV,
            # Its own origin is the one trusted to post and to open the console's socket.
            "CSRF_TRUSTED_ORIGINS": f"http://127.0.0.1:{port}",
            "WARDEN_TEST_SHARED_SERVER": self.token,
        })
        server = SharedServer(process, port, name)
        self.web[key] = server
        wait_for(lambda: _listening(port) or process.poll() is not None, timeout=60,
                 message="the web server to accept connections")
        if process.poll() is not None:
            raise AssertionError(f"the web server exited with {process.returncode}; see {LOG_DIR}/shared-web-{self._started}.log")
        return server

    def simulator(self, env: dict[str, str]) -> SharedServer:
        if self.sim is not None and self.sim.process.poll() is None:
            _signal_group(self.sim.process, signal.SIGCONT)
            return self.sim
        process = _spawn("shared-sim", _daphne(self.sim_port, SIMULATOR_ASGI), {**env, **_SHARED_ENV, "PGAPPNAME": "shared-sim"})
        self.sim = SharedServer(process, self.sim_port, "shared-sim")
        wait_for(lambda: _listening(self.sim_port), timeout=60, message="the simulated payment service to accept connections")
        return self.sim

    def pause(self, server: SharedServer) -> None:
        """Stopped between tests (no heartbeat, no query while the database is flushed) — at a
        moment none of its connections is in a statement or a transaction; a server that never
        comes to rest is killed instead."""
        for _ in range(100):
            _signal_group(server.process, signal.SIGSTOP)
            time.sleep(0.02)  # what it sent before it stopped reaches the database
            if not self._busy(server):
                return
            _signal_group(server.process, signal.SIGCONT)
            time.sleep(0.05)
        self.web = OrderedDict((key, kept) for key, kept in self.web.items() if kept is not server)
        if server is self.sim:
            self.sim = None
        self._kill(server)

    @staticmethod
    def _busy(server: SharedServer) -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND application_name = %s AND state <> 'idle'", [server.application_name])
            return cursor.fetchone()[0] > 0

    def _resume(self, server: SharedServer) -> bool:
        if server.process.poll() is not None:
            return False
        _signal_group(server.process, signal.SIGCONT)
        request = urllib.request.Request(f"http://127.0.0.1:{server.port}/__tests__/reset", method="POST",
                                         headers={"X-Test-Reset-Token": self.token})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status == 204
        except OSError:
            return False

    @staticmethod
    def _kill(server: SharedServer) -> None:
        _signal_group(server.process, signal.SIGKILL)
        server.process.wait()

    def close(self) -> None:
        servers = [*self.web.values(), *([self.sim] if self.sim else [])]
        for server in servers:
            self._kill(server)
        self.web.clear()
        self.sim = None
        # The database notices a killed client's connections a moment later; the test database
        # is dropped only once they are gone.
        names = [server.application_name for server in servers]
        if names:
            def gone():
                with connection.cursor() as cursor:
                    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                   "AND application_name = ANY(%s)", [names])
                    return cursor.fetchone()[0] == 0
            wait_for(gone, timeout=30, message="the shared servers' database connections to close")
            connection.close()


class ProcessGroup:
    """Starts and stops the processes of one test; everything it started is killed at the end, and
    the shared servers it used are stopped until the next test asks for them."""

    def __init__(self, *, name: str, env: dict[str, str] | None = None, shared: SharedServers | None = None):
        self.name = name
        self.shared = shared
        self.port = free_port()
        self.sim_port = shared.sim_port if shared else free_port()
        self._borrowed: list[SharedServer] = []
        # False: the test breaks what a shared server holds (it terminates every database
        # connection) or counts every connection made; the shared servers end with it.
        self.keep_shared = True
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

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, label: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        process = _spawn(f"{self.name}-{label}", argv, {**self.base_env, **(env or {})})
        self.processes[label] = process
        return process

    def start_web(self, *, simulator: bool = False) -> subprocess.Popen:
        """The web server (the session's shared one for this environment, when there is a session);
        with `simulator`, the simulated payment service the demo tools call, as in `make run`."""
        if simulator:
            self.start_sim()
        if self.shared is None:
            process = self.start("web", _daphne(self.port, "server.asgi:application"))
            wait_for(lambda: _listening(self.port), timeout=60, message="the web server to accept connections")
            return process
        server = self.shared.web_server(self.base_env)
        self._borrowed.append(server)
        self.port = server.port
        self.base_env["CSRF_TRUSTED_ORIGINS"] = self.base_url
        return server.process

    @property
    def web_application_name(self) -> str:
        """The application_name the web server's database connections carry (pg_stat_activity)."""
        return self._borrowed[-1].application_name if self.shared is not None else self.base_env.get("PGAPPNAME", "")

    def start_sim(self) -> subprocess.Popen:
        """The simulated payment service's own application (demo/asgi.py) on its own port."""
        if self.shared is not None:
            server = self.shared.simulator(self.base_env)
            self._borrowed.append(server)
            return server.process
        process = self.start("sim", _daphne(self.sim_port, SIMULATOR_ASGI))
        wait_for(lambda: _listening(self.sim_port), timeout=60, message="the simulated payment service to accept connections")
        return process

    _listening = staticmethod(_listening)

    def start_workers(self, label: str = "workers", *, workers: int = 1, env: dict[str, str] | None = None) -> subprocess.Popen:
        return self.start(label, [sys.executable, "manage.py", "qcluster"], env={"WARDEN_WORKERS": str(workers), **(env or {})})

    def start_sweeper(self, interval: float = 0.5, *, env: dict[str, str] | None = None) -> subprocess.Popen:
        return self.start("sweeper", [sys.executable, "manage.py", "sweep", "--loop", "--interval", str(interval)], env=env)

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
        # Its children in process groups of their own (serve_all's) would outlive the group.
        strays = descendants(process.pid)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in strays:
            try:
                os.kill(pid, signal.SIGKILL)
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
        """Kill what the test started and stop the shared servers it used until the next test asks
        for them — or, when the test set `keep_shared = False`, kill every shared server too."""
        for label in list(self.processes):
            self.stop(label)
        for server in self._borrowed:
            self.shared.pause(server)
        self._borrowed.clear()
        if self.shared is not None and not self.keep_shared:
            self.shared.close()
        connection.close()
