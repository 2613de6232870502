"""`make run`: the web server (daphne), a django-q2 worker cluster and the sweeper — and in demo
mode the simulated payment service on a daphne of its own — stopped together by Ctrl-C or SIGTERM.

Each child runs in a process group of its own, so a terminal's Ctrl-C reaches this process only,
and the stop is this process's to make: SIGTERM to each child's leader (never to a whole group: a
django-q2 cluster whose sentinel is signalled with its parent can wait forever for it), then, after
`STOP_GRACE_SECONDS`, SIGKILL to every group still holding a process — so nothing it started outlives
it by more than a few seconds. A run its workers were driving is taken over after its lease
expires, as after any crash (docs/OPERATIONS.md)."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from django.conf import settings
from django.core.management.base import BaseCommand

from cli.banner import banner_sections

STOP_GRACE_SECONDS = 7.0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - another user's process took the id
        return False
    return True


def stop_children(children: list[subprocess.Popen], *, grace: float = STOP_GRACE_SECONDS,
                  hurry: Callable[[], bool] = lambda: False) -> None:
    """SIGTERM to each child's leader, SIGKILL after `grace` (or at once when `hurry()`: a second
    Ctrl-C) to every group still alive, and wait until no process of any group is left."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not hurry():
        for child in children:
            child.poll()  # reap the leaders that ended
        if not any(_group_alive(child.pid) for child in children):
            return
        time.sleep(0.1)
    for child in children:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for child in children:
        child.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_group_alive(child.pid) for child in children):
        time.sleep(0.05)


class Command(BaseCommand):
    help = "Run the web server and the worker cluster in the foreground."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", default="8000")
        parser.add_argument("--no-workers", action="store_true")

    def handle(self, *args, host, port, no_workers, **options):
        env = dict(os.environ)
        # Links in webhook bodies and the demo's pages name this instance, not the default port
        # (issue 27, finding 12: another instance received a stranger's webhooks and links).
        env.setdefault("WARDEN_PUBLIC_URL", f"http://{host}:{port}")
        daphne = [sys.executable, "-m", "daphne", "-b", host]
        children: list[subprocess.Popen] = []

        def start(argv: list[str]) -> None:
            children.append(subprocess.Popen(argv, env=env, start_new_session=True))

        # Plain flags: a signal handler must not take a lock the interrupted code may hold.
        signals_received = [0]

        def stop(*_):
            signals_received[0] += 1

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        start([*daphne, "-p", str(port), "server.asgi:application"])
        if settings.WARDEN_DEMO:
            # The simulated payment service stands for an external system: its own application
            # on its own port, never a route of the main one. (Its own server also means a
            # synchronous admin view that calls it, e.g. "query downstream now", never waits on
            # the web server's only sync thread.)
            sim_port = int(port) + 1
            env.setdefault("WARDEN_SIM_BASE_URL", f"http://{host}:{sim_port}/sim")
            # The demo's webhook endpoint (demo_setup made it for the default ports) follows them.
            subprocess.run([sys.executable, "manage.py", "demo_point_webhooks"], env=env, check=False)
            start([*daphne, "-p", str(sim_port), "--verbosity", "0", "demo.asgi:application"])
        if not no_workers:
            start([sys.executable, "manage.py", "qcluster"])
            # Second-level recovery (expired leases, backoffs, reconciliation); the django-q2
            # schedule does the same every minute where this process is not run.
            start([sys.executable, "manage.py", "sweep", "--loop"])
        base = f"http://{host}:{port}"
        extra = "".join(f"  {line}\n" for line in banner_sections(env))
        self.stdout.write(
            self.style.SUCCESS(
                "\nWarden is starting:\n"
                f"  console      {base}/console/\n"
                f"  admin        {base}/admin/\n"
                f"  API docs     {base}/api/v1/docs\n"
                f"  health       {base}/readyz, metrics {base}/metrics\n"
                f"{extra}"
                "Press Ctrl-C to stop.\n"
            )
        )
        try:
            while not signals_received[0] and all(child.poll() is None for child in children):
                time.sleep(0.2)
        finally:
            stop_children(children, hurry=lambda: signals_received[0] > 1)
        failed = [c.args for c in children if c.returncode not in (0, -signal.SIGTERM, -signal.SIGKILL) and not signals_received[0]]
        if failed:
            raise SystemExit(f"a child process stopped unexpectedly: {failed}")
