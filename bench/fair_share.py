"""One customer's burst against another customer's clicks (issue 27, finding 4), through a real
daphne with the default pool (WARDEN_DB_POOL_SIZE 10, fair share 5).

Waves of `--burst` concurrent `POST /sessions/{id}/messages` by one customer to one session (the
first starts a run, the rest queue input for it; no worker runs, so every post takes the session's
lock; the rate limits are raised out of the way, so the pool alone is measured) go on for `--seconds`, while another customer sends `GET /me` then `GET /sessions` one after the
other, as a person clicks. Printed: the burst's answers by status (never a 5xx but 503 try_again, the
share's refusal), and the other customer's latency p50 / p99 / max idle and during the burst.

Usage: DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python bench/fair_share.py
                                                            [--burst 50] [--seconds 20]
The bench re-creates the database warden_bench_fair on DATABASE_URL's server.
"""

import argparse
import collections
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BENCH_DB = "warden_bench_fair"


def bench_database_url() -> str:
    parts = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    return urlunsplit(parts._replace(path=f"/{BENCH_DB}"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def seed() -> tuple[str, str, str]:
    """Two customers with a key each, and the greedy one's session."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from sessions_app.api_keys import api_key_create
    from sessions_app.models import Session

    User = get_user_model()
    greedy = User.objects.create_user("bench_greedy")
    patient = User.objects.create_user("bench_patient")
    session = Session.objects.create(owner=greedy, title="burst")
    return api_key_create(owner=greedy, name="bench")[1], api_key_create(owner=patient, name="bench")[1], str(session.pk)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def clicks(base: str, secret: str, stop: threading.Event, latencies: list[float], statuses: collections.Counter) -> None:
    with httpx.Client(base_url=base, trust_env=False, timeout=120, headers={"Authorization": f"Bearer {secret}"}) as http:
        while not stop.is_set():
            for path in ("/api/v1/me", "/api/v1/sessions"):
                started = time.perf_counter()
                statuses[http.get(path).status_code] += 1
                latencies.append(time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--burst", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()

    url = bench_database_url()
    env = {**os.environ, "DATABASE_URL": url, "WARDEN_DEMO": "1", "DJANGO_SETTINGS_MODULE": "config.settings",
           "WARDEN_API_RATE_PER_KEY": "100000/min", "WARDEN_API_RATE_PER_USER": "100000/min",
           "WARDEN_API_WRITE_RATE_PER_USER": "100000/min"}
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    greedy_key, patient_key, session_id = seed()
    port = free_port()
    web = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "server.asgi:application"],
                           cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{base}/healthz", trust_env=False, timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise SystemExit("the web server did not start")
                time.sleep(0.2)

        def measure(seconds: float, with_burst: bool):
            stop, latencies, statuses, burst = threading.Event(), [], collections.Counter(), collections.Counter()
            clicker = threading.Thread(target=clicks, args=(base, patient_key, stop, latencies, statuses))
            clicker.start()
            ends = time.monotonic() + seconds
            with httpx.Client(base_url=base, trust_env=False, timeout=120, limits=httpx.Limits(max_connections=args.burst),
                              headers={"Authorization": f"Bearer {greedy_key}"}) as http, \
                    ThreadPoolExecutor(max_workers=args.burst) as pool:
                while time.monotonic() < ends:
                    if not with_burst:
                        time.sleep(0.1)
                        continue
                    wave = [pool.submit(http.post, f"/api/v1/sessions/{session_id}/messages",
                                        json={"content": f"refund {n}", "mode": "queue"}) for n in range(args.burst)]
                    for answer in wave:
                        burst[answer.result().status_code] += 1
            stop.set()
            clicker.join()
            return latencies, statuses, burst

        idle, idle_statuses, _ = measure(min(5.0, args.seconds), with_burst=False)
        busy, busy_statuses, burst = measure(args.seconds, with_burst=True)
    finally:
        os.killpg(web.pid, 15)
        web.wait(timeout=30)

    def row(name, values):
        return (f"| {name} | {len(values)} | {statistics.median(values) * 1000:.0f} | {percentile(values, 0.99) * 1000:.0f} "
                f"| {max(values) * 1000:.0f} |")

    print(f"burst: {args.burst} concurrent posts a wave for {args.seconds:g} s — answers {dict(sorted(burst.items()))}")
    print(f"other customer's answers: idle {dict(idle_statuses)}, during the burst {dict(busy_statuses)}")
    print("| other customer's requests | n | p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|")
    print(row("idle", idle))
    print(row("during the burst", busy))
    if any(status >= 500 and status != 503 for status in (*burst, *busy_statuses)) or 503 in busy_statuses:
        raise SystemExit("a server error, or the other customer was refused")


if __name__ == "__main__":
    main()
