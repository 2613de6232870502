"""`make run`: the web server (daphne), a django-q2 worker cluster and the sweeper — and in demo
mode the simulated payment service on a daphne of its own — stopped together by Ctrl-C."""

import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand

from cli.banner import banner_sections


class Command(BaseCommand):
    help = "Run the web server and the worker cluster in the foreground."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", default="8000")
        parser.add_argument("--no-workers", action="store_true")

    def handle(self, *args, host, port, no_workers, **options):
        env = dict(os.environ)
        daphne = [sys.executable, "-m", "daphne", "-b", host]
        children = [subprocess.Popen([*daphne, "-p", str(port), "server.asgi:application"], env=env)]
        if settings.WARDEN_DEMO:
            # The simulated payment service stands for an external system: its own application
            # on its own port, never a route of the main one. (Its own server also means a
            # synchronous admin view that calls it, e.g. "query downstream now", never waits on
            # the web server's only sync thread.)
            sim_port = int(port) + 1
            env.setdefault("WARDEN_SIM_BASE_URL", f"http://{host}:{sim_port}/sim")
            children.append(subprocess.Popen(
                [*daphne, "-p", str(sim_port), "--verbosity", "0", "demo.asgi:application"], env=env))
        if not no_workers:
            children.append(subprocess.Popen([sys.executable, "manage.py", "qcluster"], env=env))
            # Second-level recovery (expired leases, backoffs, reconciliation); the django-q2
            # schedule does the same every minute where this process is not run.
            children.append(subprocess.Popen([sys.executable, "manage.py", "sweep", "--loop"], env=env))
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
        stopping = False

        def stop(*_):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            while not stopping and all(child.poll() is None for child in children):
                time.sleep(0.3)
        finally:
            for child in children:
                if child.poll() is None:
                    child.send_signal(signal.SIGINT)
            deadline = time.monotonic() + 15
            for child in children:
                try:
                    child.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.kill()
        failed = [c.args for c in children if c.returncode not in (0, -signal.SIGINT, None) and not stopping]
        if failed:
            raise SystemExit(f"a child process stopped unexpectedly: {failed}")
