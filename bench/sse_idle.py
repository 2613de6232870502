"""Idle SSE streams (issue 16, "idle is free"): what `--clients` open, quiet event streams cost
one daphne — SQL per second, daphne's CPU, threads and memory.

The system is real: one daphne serving the product (`server.asgi:application`) on the database
warden_bench_sse (dropped and re-created), the channel layer of the settings (PostgreSQL by
default, Redis with --layer redis), and `--clients` raw-socket HTTP clients in this process, each
streaming `GET /api/v1/runs/{id}/events/stream` of its own run, which waits for an approval and
never moves: after catching up (two events) every stream is idle.

The one bench-only piece: daphne is started through this script (`--serve`), which counts every
SQL statement Django's connections send (by a connection execute_wrapper, the web heartbeat
thread's apart) before handing over to daphne's own command line. The server's code is the
product's, unchanged; `--server-root DIR` serves another checkout of it (an export of an older
commit, for the figures before a change) with this script's counting.

Measured over `--seconds` once every client has caught up and `--settle` seconds more have
passed: statements/s from the counter; transactions/s of the database from pg_stat_database
(every source: Django, the channel layer's own connections, the heartbeat; the rate with no
client connected, measured first, is subtracted); daphne's CPU (user + system, % of one core),
threads and RSS; the CPU of the PostgreSQL backends connected to the database. Then every client
disconnects, and the groups and advisory locks the layer still holds are counted.

Usage: python bench/sse_idle.py [--clients 1000] [--seconds 60] [--settle 10] [--layer postgres|redis]
                                [--server-root DIR] [--label TEXT] [--sse NAME=VALUE ...] [--json PATH]
Needs DATABASE_URL (or the embedded server).
"""

import argparse
import asyncio
import collections
import json
import os
import platform
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
BENCH_DB = "warden_bench_sse"
HEARTBEAT_THREAD = "web-heartbeat"


# --- the server side (a separate process: `--serve PORT COUNTS`) ------------------------------------


def serve(port: int, counts_path: str) -> None:
    """daphne, from the current directory's checkout, counting Django's SQL statements."""
    sys.path.insert(0, os.getcwd())
    from django.db.backends.signals import connection_created

    counts: collections.Counter = collections.Counter()
    lock = threading.Lock()

    def count(execute, sql, params, many, context):
        kind = "heartbeat" if threading.current_thread().name == HEARTBEAT_THREAD else "requests"
        with lock:
            counts[kind] += 1
        return execute(sql, params, many, context)

    def install(sender, connection, **kwargs):
        if count not in connection.execute_wrappers:
            connection.execute_wrappers.append(count)

    def write_forever():
        while True:
            time.sleep(0.5)
            with lock:
                snapshot = dict(counts)
            Path(counts_path + ".tmp").write_text(json.dumps(snapshot))
            os.replace(counts_path + ".tmp", counts_path)

    connection_created.connect(install)
    threading.Thread(target=write_forever, name="bench-counter", daemon=True).start()
    import server.asgi  # noqa: F401 - Django set up as daphne does it
    from api import streams as api

    for name, value in json.loads(os.environ.get("SSE_BENCH_SETTINGS", "{}")).items():
        setattr(api, name, value)  # --sse NAME=VALUE: a variant of the stream's timings

    from daphne.cli import CommandLineInterface

    sys.argv = ["daphne", "-b", "127.0.0.1", "-p", str(port), "server.asgi:application"]
    CommandLineInterface.entrypoint()


# --- set-up -------------------------------------------------------------------------------------------


def bench_database_url(base: str) -> str:
    import psycopg

    parts = urlsplit(base)
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    return urlunsplit(parts._replace(path=f"/{BENCH_DB}"))


def create_world(clients: int) -> list[tuple[str, str]]:
    """Per client an API key and a run waiting for an approval, events 1..2 (one user owns them)."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone as dj_timezone

    from runs_app.models import Run, RunEvent, RunStatus, WaitReason
    from sessions_app.api_keys import api_key_create
    from sessions_app.models import Session

    user = get_user_model().objects.create_user(username="bench", password="bench-pass")
    # A key each, as separate API clients would have: each key's last-used stamp is its own write.
    keys = [api_key_create(owner=user, name=f"bench {n}")[1] for n in range(clients)]
    sessions = Session.objects.bulk_create([Session(owner=user, title=f"idle {n}") for n in range(clients)])
    deadline = dj_timezone.now() + timedelta(hours=2)
    runs = Run.objects.bulk_create([
        Run(session=session, created_by=user, status=RunStatus.WAITING, phase="", wait_reason=WaitReason.APPROVAL,
            max_model_calls=10, max_tokens=100_000, deadline=deadline, event_seq=2)
        for session in sessions
    ])
    RunEvent.objects.bulk_create([
        RunEvent(run=run, seq=seq, type=kind, payload={"status": RunStatus.WAITING, "phase": "", "wait_reason": WaitReason.APPROVAL})
        for run in runs for seq, kind in ((1, "run_status"), (2, "run_status"))
    ])
    return [(key, str(run.pk)) for key, run in zip(keys, runs)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("daphne did not start")


# --- measuring ------------------------------------------------------------------------------------------


class Client:
    """One SSE connection over a raw socket; counts what it was sent."""

    def __init__(self):
        self.caught_up = asyncio.Event()
        self.status = b""
        self.keepalives = 0
        self.events = 0
        self.closed_by_server = False
        self.tail = b""


async def stream(port: int, key: str, run_id: str, client: Client) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write((f"GET /api/v1/runs/{run_id}/events/stream?max_seconds=3600 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                  f"Authorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n").encode())
    try:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                client.closed_by_server = True
                client.caught_up.set()
                return
            if not client.status:
                client.status = chunk.split(b"\r\n", 1)[0]
            # A frame split between two reads is found in the tail of one and the next read.
            tail, text = client.tail, client.tail + chunk
            client.keepalives += text.count(b": keepalive\n") - tail.count(b": keepalive\n")
            client.events += text.count(b"\nid: ") - tail.count(b"\nid: ")
            client.tail = text[-16:]
            if b"id: 2\n" in text:
                client.caught_up.set()
    finally:
        writer.close()


def counted(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def xacts(conn) -> int:
    row = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (BENCH_DB,)).fetchone()
    return int(row[0])


def backend_cpu(conn) -> dict[int, float]:
    import psutil

    pids = [row[0] for row in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                                           (BENCH_DB,)).fetchall()]
    cpu = {}
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
            cpu[pid] = times.user + times.system
        except psutil.Error:
            pass
    return cpu


def sample(daphne, conn, counts_path: Path) -> dict:
    times = daphne.cpu_times()
    return {"t": time.monotonic(), "cpu": times.user + times.system, "xacts": xacts(conn),
            "statements": counted(counts_path).get("requests", 0), "backends": backend_cpu(conn)}


def rates(first: dict, last: dict) -> dict:
    seconds = last["t"] - first["t"]
    shared = set(first["backends"]) & set(last["backends"])
    return {
        "seconds": seconds,
        "statements_per_s": (last["statements"] - first["statements"]) / seconds,
        "xacts_per_s": (last["xacts"] - first["xacts"]) / seconds,
        "daphne_cpu_pct": 100 * (last["cpu"] - first["cpu"]) / seconds,
        "pg_backends_cpu_pct": 100 * sum(last["backends"][pid] - first["backends"][pid] for pid in shared) / seconds,
    }


async def measure(args, port: int, streams: list[tuple[str, str]], daphne, conn, counts_path: Path) -> dict:
    # With no client: the heartbeat's and the layer's own rate, subtracted below.
    await asyncio.sleep(2)
    empty_first = sample(daphne, conn, counts_path)
    await asyncio.sleep(args.baseline)
    baseline = rates(empty_first, sample(daphne, conn, counts_path))

    clients = [Client() for _ in streams]
    tasks = []
    started = time.monotonic()
    for batch in range(0, len(streams), args.batch):  # daphne's listen backlog is 50
        for (key, run_id), client in zip(streams[batch:batch + args.batch], clients[batch:batch + args.batch]):
            tasks.append(asyncio.create_task(stream(port, key, run_id, client)))
        await asyncio.wait_for(asyncio.gather(*(c.caught_up.wait() for c in clients[batch:batch + args.batch])), 120)
    connected_in = time.monotonic() - started
    refused = [c.status for c in clients if not c.status.endswith(b"200 OK") or c.closed_by_server]
    if refused:
        raise SystemExit(f"{len(refused)} streams refused or ended: {collections.Counter(refused).most_common(3)}")

    await asyncio.sleep(args.settle)
    keepalives_before = sum(c.keepalives for c in clients)
    first = sample(daphne, conn, counts_path)
    await asyncio.sleep(args.seconds)
    last = sample(daphne, conn, counts_path)
    idle = rates(first, last)
    threads, rss = daphne.num_threads(), daphne.memory_info().rss
    ended = sum(c.closed_by_server for c in clients)
    keepalives = sum(c.keepalives for c in clients) - keepalives_before
    events_after = sum(c.events for c in clients) - 2 * len(clients)

    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    left = {}
    for _ in range(60):  # the streams leave their groups once daphne notices the disconnects
        await asyncio.sleep(0.5)
        left = layer_leftovers(conn)
        if not left["group_rows"]:
            break
    per_client = len(clients)
    return {  # the headline figures first (bench/compare.py quotes the first few numbers)
        "statements_per_s_per_client": idle["statements_per_s"] / per_client,
        "xacts_per_s_per_client": (idle["xacts_per_s"] - baseline["xacts_per_s"]) / per_client,
        "daphne_cpu_pct_above_baseline": idle["daphne_cpu_pct"] - baseline["daphne_cpu_pct"],
        "daphne_threads": threads,
        "daphne_rss_mb": round(rss / 2**20),
        "connected_in_s": round(connected_in, 1),
        "baseline_no_clients": baseline,
        "idle": idle,
        "keepalives_per_client": keepalives / per_client,
        "events_sent_while_idle": events_after,
        "streams_ended_by_server": ended,
        "after_disconnect": left,
    }


def layer_leftovers(conn) -> dict:
    groups = conn.execute("SELECT to_regclass('channels_postgres_groupchannel') IS NOT NULL").fetchone()[0]
    rows = conn.execute("SELECT count(*) FROM channels_postgres_groupchannel").fetchone()[0] if groups else 0
    locks = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = %s)",
        (BENCH_DB,)).fetchone()[0]
    return {"group_rows": rows, "advisory_locks": locks}


def machine() -> str:
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor()
    return f"{os.cpu_count()} vCPUs ({model}), Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60, help="the idle window measured")
    parser.add_argument("--settle", type=float, default=10, help="seconds after the last client caught up")
    parser.add_argument("--baseline", type=float, default=15, help="seconds measured with no client first")
    parser.add_argument("--batch", type=int, default=50, help="clients connecting at once")
    parser.add_argument("--layer", choices=["postgres", "redis"], default="postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/8")
    parser.add_argument("--server-root", type=Path, default=ROOT, help="the checkout daphne serves")
    parser.add_argument("--label", default="", help="what the server root is, for the report")
    parser.add_argument("--sse", action="append", default=[], metavar="NAME=VALUE",
                        help="set one of api.runs's SSE_* timings in daphne, e.g. SSE_RECHECK_SECONDS=45")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < args.clients + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.clients * 2 + 256), hard))

    base = os.environ.get("DATABASE_URL")
    if not base:
        from config.embedded_db import embedded_database_url

        base = embedded_database_url(ROOT)
    database_url = bench_database_url(base)
    os.environ["DATABASE_URL"] = database_url
    if args.layer == "redis":
        os.environ["REDIS_URL"] = args.redis_url
    else:
        os.environ.pop("REDIS_URL", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ.setdefault("WARDEN_DEMO", "1")  # as `make bench`: the development key is accepted
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WARDEN_LOG_LEVEL": "WARNING",
           # 1,000 streams open within seconds: the API's rate limits are not what is measured.
           "WARDEN_API_RATE_PER_KEY": "1000000/min", "WARDEN_API_RATE_PER_USER": "1000000/min",
           "SSE_BENCH_SETTINGS": json.dumps({name: json.loads(value) for name, value in (pair.split("=", 1) for pair in args.sse)})}
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=args.server_root, env=env, check=True)

    import django
    import psutil
    import psycopg

    django.setup()
    streams = create_world(args.clients)

    port = free_port()
    counts_path = Path(f"/tmp/{BENCH_DB}-{os.getpid()}.counts")
    log_dir = ROOT / "test-artifacts" / "bench-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / "sse_idle-web.log", "wb")
    web = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", str(port), str(counts_path)],
                           cwd=args.server_root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    load_before = os.getloadavg()[0]
    try:
        wait_port(port)
        with psycopg.connect(database_url, autocommit=True) as conn:
            result = asyncio.run(measure(args, port, streams, psutil.Process(web.pid), conn, counts_path))
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(web.pid, sig)
                web.wait(timeout=10)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        counts_path.unlink(missing_ok=True)
    report = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
        "clients": args.clients,
        **result,
        "server": args.label or str(args.server_root),
        "layer": args.layer,
        "sse_settings": args.sse,
    }
    print(json.dumps(report, indent=2))
    idle, left = result["idle"], result["after_disconnect"]
    print(f"| {report['date'][11:16]} | {report['server']} | {args.layer} | {args.clients} | {idle['seconds']:.0f} "
          f"| {idle['statements_per_s']:.1f} | **{result['statements_per_s_per_client']:.3f}** "
          f"| {result['xacts_per_s_per_client']:.3f} | {result['daphne_cpu_pct_above_baseline']:.1f} % "
          f"| {idle['pg_backends_cpu_pct']:.1f} % | {result['daphne_threads']} | {result['daphne_rss_mb']} "
          f"| {left['group_rows']} / {left['advisory_locks']} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]), sys.argv[3])
    else:
        sys.path.insert(0, str(ROOT))
        main()
