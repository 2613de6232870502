"""Latency of the HTTP API's runs list (GET /api/v1/runs) over a million runs.

Seeds a separate database (warden_bench_api on the DATABASE_URL server): a few hundred users,
one "integrator" user owning half of all sessions (a service account that opens sessions for
its customers), an operator with `runs_app.view_run`, and `--runs` runs spread over a year,
with the shapes the check constraints demand (at most one active run per session). Rows are
generated in SQL (INSERT … SELECT generate_series), so seeding takes a few minutes, not hours.

Then it sends the endpoint, with real API keys, several callers' filter combinations, including
deep keyset pages, and prints p50/p95 latency per scenario:

- `--http` (the default): through a real daphne serving server.asgi on a free port, set up as a
  deployment (WARDEN_WEB_SERVER=1, so psycopg's pool is on; DEBUG off), over one keep-alive
  HTTP connection. `server cpu ms` is daphne's CPU time per request. It also counts the database
  connections the server opened (PostgreSQL's pg_stat_database.sessions) against the requests it
  served, and measures one scenario with the pool off (WARDEN_DB_POOL_SIZE=0): alone, to count its
  connections, and beside a pooled server, requests alternating, to compare their latency.
- `--in-process`: through django.test.Client in this process — the same stack without the
  server and the socket — with `cpu ms` (this process's CPU time per request), `sql ms` (time
  waiting on the database) and queries per request. The test client keeps its connection.

Usage: python bench/runs_list.py [--http | --in-process] [--runs 1000000] [--requests 50]
       [--pool-size 10] [--reuse] [--seed-only] [--explain (with --in-process)]
"""

import argparse
import http.client
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BENCH_DB = "warden_bench_api"
USERS = 300
SESSIONS = 20_000


def bench_database_url(*, reuse: bool) -> tuple[str, bool]:
    """The bench database's URL, and whether it already exists (then it is kept with --reuse)."""
    base = os.environ.get("DATABASE_URL")
    if not base:
        from config.embedded_db import embedded_database_url

        base = embedded_database_url(ROOT)
    parts = urlsplit(base)
    import psycopg

    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DB]).fetchone() is not None
        if exists and not reuse:
            conn.execute(f'DROP DATABASE "{BENCH_DB}" WITH (FORCE)')
            exists = False
        if not exists:
            conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    return urlunsplit(parts._replace(path=f"/{BENCH_DB}")), exists


RUN_COLUMNS = """id, session_id, created_by_id, status, phase, wait_reason, wait_type, request_id, expires_at,
    resume_target, provider, provider_options, max_model_calls, model_calls, max_tokens, tokens_used, deadline,
    model_retries, lease_owner, lease_token, lease_expires_at, cancel_requested_at, cancel_requested_by_id,
    cancel_reason, error_code, error_detail, snapshot_version, event_seq, step_count, created_at, started_at,
    finished_at, updated_at, invalid_outputs, max_output_tokens, outcome, wait_started_at"""

# Run g (1..N) belongs to session (g-1) % S + 1 and is that session's k-th run, k = (g-1) / S;
# created_at grows with g over a year. Only a session's last run may be active (the partial
# unique index allows one); of those, 30% are: queued, running or waiting. The rest are
# completed (85%), failed (10%) or cancelled (5%); an ended run's outcome is set as run_end sets it.
SEED_RUNS_SQL = f"""
WITH numbered AS (
    SELECT g, ((g - 1) %% %(sessions)s) + 1 AS sidx, (g - 1) / %(sessions)s AS k, random() AS r, random() AS r2,
        1 + floor(random() * 12)::int AS pick
    FROM generate_series(1, %(runs)s) AS g
), shaped AS (
    SELECT n.*, s.id AS session_id, s.owner_id,
        %(start)s::timestamptz + (n.g * 31536000.0 / %(runs)s) * interval '1 second' AS created,
        CASE
            WHEN n.k = (%(runs)s - n.sidx) / %(sessions)s AND n.r < 0.10 THEN 'queued'
            WHEN n.k = (%(runs)s - n.sidx) / %(sessions)s AND n.r < 0.15 THEN 'running'
            WHEN n.k = (%(runs)s - n.sidx) / %(sessions)s AND n.r < 0.30 THEN 'waiting'
            WHEN n.r2 < 0.85 THEN 'completed'
            WHEN n.r2 < 0.95 THEN 'failed'
            ELSE 'cancelled'
        END AS status
    FROM numbered n JOIN bench_session_index s ON s.sidx = n.sidx
)
INSERT INTO runs_app_run ({RUN_COLUMNS})
SELECT gen_random_uuid(), session_id, owner_id, status,
    CASE status WHEN 'queued' THEN 'waiting_worker'
        WHEN 'running' THEN (ARRAY['preparing_context', 'calling_model', 'executing_tools'])[1 + pick %% 3]
        ELSE '' END,
    CASE status WHEN 'waiting' THEN (ARRAY['waiting_input', 'approval', 'retry_backoff', 'reconciliation'])[1 + pick %% 4]
        ELSE '' END,
    '', '', NULL, '', 'scripted', '{{}}'::jsonb, 20, (g %% 7), 200000, (g %% 7) * 900, created + interval '1 hour',
    0, CASE status WHEN 'running' THEN 'bench-worker' ELSE '' END, 1,
    CASE status WHEN 'running' THEN now() + interval '30 seconds' END,
    CASE status WHEN 'cancelled' THEN created + interval '5 seconds' END, NULL,
    '', CASE status WHEN 'failed' THEN 'budget_model_calls' ELSE '' END, '', 5, 5, (g %% 7),
    created, created + interval '50 milliseconds',
    CASE WHEN status IN ('completed', 'failed', 'cancelled') THEN created + interval '9 seconds' END,
    created + interval '9 seconds', 0, 0,
    CASE status WHEN 'completed' THEN (ARRAY['applied', 'none', 'rejected'])[1 + pick %% 3]
        WHEN 'failed' THEN 'not_applied' WHEN 'cancelled' THEN 'not_applied' ELSE '' END,
    CASE status WHEN 'waiting' THEN created + interval '9 seconds' END
FROM shaped
"""


def seed(*, runs: int) -> None:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django.db import connection

    User = get_user_model()
    started = time.perf_counter()
    users = User.objects.bulk_create(
        [User(username=f"bench_user_{i}", password="!") for i in range(USERS)]
        + [User(username="bench_integrator", password="!"), User(username="bench_operator", password="!", is_staff=True)]
    )
    integrator, operator = users[-2], users[-1]
    operator.user_permissions.add(Permission.objects.get(codename="view_run", content_type__app_label="runs_app"))
    start = datetime(2025, 1, 1, tzinfo=timezone.utc)
    with connection.cursor() as cursor:
        # Every other session belongs to the integrator; the rest are spread over the users.
        cursor.execute(
            """
            INSERT INTO sessions_app_session (id, owner_id, title, message_seq, created_at, updated_at)
            SELECT gen_random_uuid(),
                   CASE WHEN g %% 2 = 0 THEN %(integrator)s ELSE %(first_user)s + (g / 2 %% %(users)s) END,
                   'bench session ' || g, 0, %(start)s::timestamptz + g * interval '1 second', now()
            FROM generate_series(1, %(sessions)s) AS g
            """,
            {"sessions": SESSIONS, "integrator": integrator.pk, "first_user": users[0].pk, "users": USERS, "start": start},
        )
        cursor.execute(
            "CREATE TEMP TABLE bench_session_index AS "
            "SELECT row_number() OVER (ORDER BY created_at, id) AS sidx, id, owner_id FROM sessions_app_session"
        )
        cursor.execute("CREATE INDEX ON bench_session_index (sidx)")
        cursor.execute("ANALYZE bench_session_index")
        print(f"  users and sessions: {time.perf_counter() - started:.1f}s", flush=True)
        cursor.execute(SEED_RUNS_SQL.replace("%(sessions)s", str(SESSIONS)).replace("%(runs)s", str(runs)), {"start": start})
        print(f"  {runs} runs: {time.perf_counter() - started:.1f}s", flush=True)
    connection.close()
    # VACUUM (not only ANALYZE) sets the visibility map, as autovacuum would on a live system.
    import psycopg

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    print(f"  vacuum analyze: {time.perf_counter() - started:.1f}s", flush=True)


def scenarios():
    """(caller, label, query string) combinations measured; `{...}` is filled from the data."""
    return [
        ("integrator", "no filter, first page", "limit=50"),
        ("integrator", "status=completed", "status=completed&limit=50"),
        ("integrator", "status=waiting", "status=waiting&limit=50"),
        ("integrator", "wait_reason=approval", "wait_reason=approval&limit=50"),
        ("integrator", "phase=calling_model", "phase=calling_model&limit=50"),
        ("integrator", "created range (1 week)", "created_after=2025-06-01T00:00:00Z&created_before=2025-06-08T00:00:00Z&limit=50"),
        ("integrator", "session={session}", "session={session}&limit=50"),
        ("integrator", "page 20 (keyset)", "limit=50&cursor={integrator_cursor}"),
        ("small user", "no filter, first page", "limit=50"),
        ("small user", "status=failed", "status=failed&limit=50"),
        ("small user", "status=waiting", "status=waiting&limit=50"),
        ("small user", "limit=200", "limit=200"),
        ("operator", "no filter, first page", "limit=50"),
        ("operator", "status=waiting", "status=waiting&limit=50"),
        ("operator", "wait_reason=reconciliation", "wait_reason=reconciliation&limit=50"),
        ("operator", "status=failed, created range", "status=failed&created_after=2025-03-01T00:00:00Z&created_before=2025-04-01T00:00:00Z&limit=50"),
        ("operator", "page 20 (keyset)", "limit=50&cursor={operator_cursor}"),
    ]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# The API's rate limits stay in the request path (each request still reads and writes its
# throttle history in the cache) but out of the way: 17 scenarios of 50 requests exceed the
# default 300/min per key. A one-second window keeps each history as short as a normal caller's.
UNTHROTTLED = {"WARDEN_API_RATE_PER_KEY": "100000/s", "WARDEN_API_RATE_PER_USER": "100000/s"}
# Marks the measured server's database connections in pg_stat_activity.
SERVER_APPLICATION_NAME = "warden-bench-web"
POOL_OFF_SCENARIO = ("integrator", "no filter, first page")
SERVER_START_SECONDS = 60


def api_keys_create() -> dict[str, str]:
    """A fresh API key (the raw secret) for each caller; earlier bench keys are deleted."""
    from django.contrib.auth import get_user_model

    from sessions_app.api_keys import api_key_create
    from sessions_app.models import ApiKey

    User = get_user_model()
    ApiKey.objects.all().delete()
    owners = {"integrator": "bench_integrator", "small user": "bench_user_7", "operator": "bench_operator"}
    return {caller: api_key_create(owner=User.objects.get(username=username), name="bench")[1]
            for caller, username in owners.items()}


def session_pick() -> str:
    from sessions_app.models import Session

    return str(Session.objects.filter(owner__username="bench_integrator").order_by("-created_at").values_list("id", flat=True)[3])


def cursors_follow(get) -> dict[str, str]:
    """The page-20 cursors of scenarios(), followed through the API with `get(caller, query)`."""
    def cursor_after(caller: str, pages: int) -> str:
        cursor = ""
        for _ in range(pages):
            status, body = get(caller, f"limit=50{'&cursor=' + cursor if cursor else ''}")
            assert status == 200, (caller, status, body[:300])
            cursor = json.loads(body)["next_cursor"]
        return cursor

    return {"integrator_cursor": cursor_after("integrator", 19), "operator_cursor": cursor_after("operator", 19)}


def measure_in_process(*, keys: dict[str, str], requests: int, explain: bool) -> list[dict]:
    from django.conf import settings
    from django.db import connection, reset_queries
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    for name, rate in UNTHROTTLED.items():
        setattr(settings, name, rate)
    client = Client(HTTP_HOST="127.0.0.1")  # a host ALLOWED_HOSTS accepts by default (not `testserver`)

    def get(caller: str, query: str) -> tuple[int, bytes]:
        response = client.get(f"/api/v1/runs?{query}", HTTP_AUTHORIZATION=f"Bearer {keys[caller]}")
        return response.status_code, response.content

    fill = {"session": session_pick(), **cursors_follow(get)}
    results = []
    for caller, label, query in scenarios():
        query = query.format(**fill)
        status, body = get(caller, query)
        assert status == 200, (caller, query, status, body[:300])
        latencies, cpu_times, sql_times, counts = [], [], [], []
        for _ in range(requests):
            reset_queries()
            with CaptureQueriesContext(connection) as captured:
                c0, t0 = time.process_time(), time.perf_counter()
                status, _ = get(caller, query)
                latencies.append((time.perf_counter() - t0) * 1000)
                cpu_times.append((time.process_time() - c0) * 1000)
            assert status == 200
            counts.append(len(captured.captured_queries))
            sql_times.append(sum(float(q["time"]) for q in captured.captured_queries) * 1000)
        results.append({
            "caller": caller, "scenario": label, "items": len(json.loads(body)["items"]),
            "p50": statistics.median(latencies), "p95": percentile(latencies, 0.95), "latencies": latencies,
            "cpu": statistics.median(cpu_times), "sql": statistics.median(sql_times), "queries": max(counts),
        })
        if explain:
            with CaptureQueriesContext(connection) as captured:
                get(caller, query)
            sql = next(q["sql"] for q in captured.captured_queries if 'FROM "runs_app_run"' in q["sql"])
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
                print(f"\n-- {caller}: {label}\n" + "\n".join(row[0] for row in cursor.fetchall()))
    return results


class CountingConnection(http.client.HTTPConnection):
    """An HTTP/1.1 connection that is reused while the server keeps it open; `connects` counts
    the TCP connections it needed (1 when every request went over keep-alive)."""

    connects = 0

    def connect(self):
        self.connects += 1
        super().connect()


class ApiClient:
    def __init__(self, *, port: int, keys: dict[str, str]):
        self.connection = CountingConnection("127.0.0.1", port, timeout=60)
        self.keys = keys
        self.requests = 0

    def get(self, caller: str, query: str) -> tuple[int, bytes]:
        self.connection.request("GET", f"/api/v1/runs?{query}", headers={"Authorization": f"Bearer {self.keys[caller]}"})
        response = self.connection.getresponse()
        body = response.read()  # read to the end, or the connection cannot carry the next request
        self.requests += 1
        return response.status, body

    def close(self) -> None:
        self.connection.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class WebServer:
    """daphne serving server.asgi:application as a deployment would, in a process group of its
    own; stopped (SIGTERM, then SIGKILL) when the block ends, however it ends."""

    def __init__(self, *, database_url: str, pool_size: int):
        self.port = free_port()
        self.pool_size = pool_size
        parts = urlsplit(database_url)
        query = f"{parts.query}&" if parts.query else ""
        self.env = {
            **os.environ, **UNTHROTTLED,
            # dj-database-url passes the query string on to psycopg as connection options.
            "DATABASE_URL": urlunsplit(parts._replace(query=f"{query}application_name={SERVER_APPLICATION_NAME}")),
            "WARDEN_WEB_SERVER": "1", "WARDEN_DB_POOL_SIZE": str(pool_size), "DEBUG": "0", "WARDEN_DEMO": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.log_path = ROOT / ".warden" / "bench" / f"runs_list-daphne-pool{pool_size}.log"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "WebServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "server.asgi:application"],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"daphne exited with {self.process.returncode}; its log:\n{self._log_tail()}")
            try:
                probe = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                probe.request("GET", "/healthz")
                if probe.getresponse().status == 200:
                    probe.close()
                    return
                probe.close()
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"daphne did not answer /healthz within {SERVER_START_SECONDS}s; its log:\n{self._log_tail()}")
            time.sleep(0.2)

    def _log_tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def stop(self) -> None:
        if self.process is None:
            return
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        self.process = None


def database_sessions(monitor) -> int:
    """Connections ever opened to the bench database (PostgreSQL counts them itself)."""
    return monitor.execute("SELECT sessions FROM pg_stat_database WHERE datname = %s", [BENCH_DB]).fetchone()[0]


def server_backends(monitor) -> set[tuple[int, datetime]]:
    """The measured server's open database connections, as (pid, backend_start)."""
    return set(monitor.execute(
        "SELECT pid, backend_start FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
        [BENCH_DB, SERVER_APPLICATION_NAME]).fetchall())


def measure_http(*, server: WebServer, client: ApiClient, fill: dict[str, str], requests: int,
                 only: tuple[str, str] | None = None) -> list[dict]:
    results = []
    for caller, label, query in scenarios():
        if only and (caller, label) != only:
            continue
        query = query.format(**fill)
        status, body = client.get(caller, query)
        assert status == 200, (caller, query, status, body[:300])
        latencies = []
        cpu_before = server.cpu_seconds()
        for _ in range(requests):
            t0 = time.perf_counter()
            status, _ = client.get(caller, query)
            latencies.append((time.perf_counter() - t0) * 1000)
            assert status == 200
        results.append({
            "caller": caller, "scenario": label, "items": len(json.loads(body)["items"]),
            "p50": statistics.median(latencies), "p95": percentile(latencies, 0.95), "latencies": latencies,
            "server_cpu": (server.cpu_seconds() - cpu_before) * 1000 / requests,
        })
    return results


def serve_and_measure(*, database_url: str, monitor, pool_size: int, keys: dict[str, str], fill: dict[str, str],
                      requests: int, only: tuple[str, str] | None = None) -> dict:
    """Start a server, measure, stop it; with the connections it opened over its whole life
    (counted once all of them have closed, when PostgreSQL has flushed their statistics)."""
    sessions_before = database_sessions(monitor)
    with WebServer(database_url=database_url, pool_size=pool_size) as server:
        client = ApiClient(port=server.port, keys=keys)
        if only is None:
            fill = {**fill, **cursors_follow(client.get)}
        backends_before = server_backends(monitor)
        results = measure_http(server=server, client=client, fill=fill, requests=requests, only=only)
        backends_after = server_backends(monitor)
        client.close()
    deadline = time.monotonic() + 15
    while server_backends(monitor) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    return {
        "results": results, "fill": fill, "pool_size": pool_size, "requests": client.requests,
        "tcp_connections": client.connection.connects, "opened": database_sessions(monitor) - sessions_before,
        "open_before": len(backends_before), "open_after": len(backends_after),
        "kept": len(backends_before & backends_after),
    }


def compare_pool(*, database_url: str, keys: dict[str, str], pool_size: int, requests: int) -> dict:
    """POOL_OFF_SCENARIO on two servers at once, pool on and pool off, the requests alternating
    between them, so both see the same co-tenant load; and what opening a connection costs."""
    import psycopg

    caller, query = POOL_OFF_SCENARIO[0], next(q for c, label, q in scenarios() if (c, label) == POOL_OFF_SCENARIO)
    with WebServer(database_url=database_url, pool_size=pool_size) as pooled, \
            WebServer(database_url=database_url, pool_size=0) as unpooled:
        servers = {"on": pooled, "off": unpooled}
        clients = {name: ApiClient(port=server.port, keys=keys) for name, server in servers.items()}
        for client in clients.values():
            assert client.get(caller, query)[0] == 200  # warm-up
        latencies = {name: [] for name in servers}
        cpu_before = {name: server.cpu_seconds() for name, server in servers.items()}
        for i in range(requests):
            for name in ("on", "off") if i % 2 == 0 else ("off", "on"):
                t0 = time.perf_counter()
                status, _ = clients[name].get(caller, query)
                latencies[name].append((time.perf_counter() - t0) * 1000)
                assert status == 200
        result = {name: {"p50": statistics.median(values), "p95": percentile(values, 0.95),
                         "server_cpu": (servers[name].cpu_seconds() - cpu_before[name]) * 1000 / requests}
                  for name, values in latencies.items()}
        for client in clients.values():
            client.close()
    connects = []
    for _ in range(20):
        t0 = time.perf_counter()
        psycopg.connect(database_url).close()
        connects.append((time.perf_counter() - t0) * 1000)
    return {**result, "connect_p50": statistics.median(connects), "connect_p95": percentile(connects, 0.95)}


def print_table(results: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """A Markdown table: (heading, result key, format) per numeric column after caller, scenario and items."""
    header = (f"| {'caller':<10} | {'scenario':<30} | {'items':>5} | "
              + " | ".join(f"{heading:>{max(6, len(heading))}}" for heading, _, _ in columns) + " |")
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    for r in results:
        cells = " | ".join(f"{format(r[key], fmt):>{max(6, len(heading))}}" for heading, key, fmt in columns)
        print(f"| {r['caller']:<10} | {r['scenario']:<30} | {r['items']:>5} | {cells} |")


def print_summary(results: list[dict], load_before: str) -> None:
    pooled = [latency for r in results for latency in r["latencies"]]
    print(f"\nall {len(pooled)} requests: p50 {statistics.median(pooled):.1f} ms, p95 {percentile(pooled, 0.95):.1f} ms, "
          f"p99 {percentile(pooled, 0.99):.1f} ms; worst scenario p95 {max(r['p95'] for r in results):.1f} ms "
          f"(target p95 ≤ 30 ms); load average before/after {load_before} / {os.getloadavg()[0]:.2f}")


def connections_line(run: dict) -> str:
    return (f"{run['opened']} database connections opened for {run['requests']} requests "
            f"(over {run['tcp_connections']} keep-alive HTTP connection(s)); server connections open "
            f"before the scenarios {run['open_before']}, after {run['open_after']}, the same backends {run['kept']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--http", dest="in_process", action="store_false",
                      help="through a real daphne over HTTP (the default)")
    mode.add_argument("--in-process", dest="in_process", action="store_true",
                      help="through django.test.Client in this process, with queries and SQL time per request")
    parser.set_defaults(in_process=False)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=50, help="timed requests per scenario")
    parser.add_argument("--pool-size", type=int, default=10, help="the server's WARDEN_DB_POOL_SIZE (--http)")
    parser.add_argument("--reuse", action="store_true", help="keep an already seeded bench database")
    parser.add_argument("--seed-only", action="store_true")
    parser.add_argument("--explain", action="store_true", help="print EXPLAIN ANALYZE of each scenario's main query (--in-process)")
    args = parser.parse_args()
    if args.explain and not args.in_process:
        parser.error("--explain needs --in-process (it reads the queries the request ran)")
    # A plain `kill` stops the server too: the with-blocks' exits run on SystemExit.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    url, existed = bench_database_url(reuse=args.reuse)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    settings.DEBUG = False
    call_command("migrate", verbosity=0)
    from runs_app.models import Run

    if not existed or not Run.objects.exists():
        print(f"seeding {args.runs} runs into {BENCH_DB}…", flush=True)
        seed(runs=args.runs)
    if args.seed_only:
        return
    total = Run.objects.count()
    keys = api_keys_create()
    versions = (f"Python {platform.python_version()}, Django {version('django')}, django-ninja {version('django-ninja')}, "
                f"daphne {version('daphne')}, psycopg {version('psycopg')}, psycopg-pool {version('psycopg-pool')}")
    data = f"{total:,} runs, {SESSIONS:,} sessions, {USERS + 2} users"
    when = f"{platform.node()}, {os.cpu_count()} CPUs, {datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    load_before = f"{os.getloadavg()[0]:.2f}"

    if args.in_process:
        results = measure_in_process(keys=keys, requests=args.requests, explain=args.explain)
        print(f"\nGET /api/v1/runs in-process (django.test.Client) — {data}; {args.requests} timed requests per row; "
              f"{versions}; {when}\n")
        print_table(results, [("p50 ms", "p50", ".1f"), ("p95 ms", "p95", ".1f"), ("cpu ms", "cpu", ".1f"),
                              ("sql ms", "sql", ".1f"), ("queries", "queries", "d")])
        print_summary(results, load_before)
        return

    import psycopg

    fill = {"session": session_pick()}
    connection.close()  # from here on, every connection to the bench database is a server's
    monitor_url = urlunsplit(urlsplit(url)._replace(path="/postgres"))
    with psycopg.connect(monitor_url, autocommit=True) as monitor:
        server_version = monitor.execute("SHOW server_version").fetchone()[0]
        pooled = serve_and_measure(database_url=url, monitor=monitor, pool_size=args.pool_size, keys=keys,
                                   fill=fill, requests=args.requests)
        load_after_table = f"{os.getloadavg()[0]:.2f}"
        unpooled = serve_and_measure(database_url=url, monitor=monitor, pool_size=0, keys=keys,
                                     fill=pooled["fill"], requests=args.requests, only=POOL_OFF_SCENARIO)
    load_before_comparison = f"{os.getloadavg()[0]:.2f}"
    comparison = compare_pool(database_url=url, keys=keys, pool_size=args.pool_size, requests=args.requests)
    results = pooled["results"]
    print(f"\nGET /api/v1/runs over HTTP through daphne (WARDEN_WEB_SERVER=1, WARDEN_DB_POOL_SIZE={args.pool_size}, "
          f"DEBUG off) — {data}; {args.requests} timed requests per row after a warm-up, one keep-alive connection; "
          f"{versions}, PostgreSQL {server_version}; {when}\n")
    print_table(results, [("p50 ms", "p50", ".1f"), ("p95 ms", "p95", ".1f"), ("server cpu ms", "server_cpu", ".1f")])
    print_summary(results, load_before)
    print(f"pool on: {connections_line(pooled)}")
    off = unpooled["results"][0]
    print(f"pool off ({' / '.join(POOL_OFF_SCENARIO)} alone, load average {load_after_table}): p50 {off['p50']:.1f} ms, "
          f"p95 {off['p95']:.1f} ms; {connections_line(unpooled)}")
    print(f"\n{' / '.join(POOL_OFF_SCENARIO)} on two servers at once, requests alternating, {args.requests} each "
          f"(load average {load_before_comparison} → {os.getloadavg()[0]:.2f}):")
    for name, label in (("on", f"pool on (WARDEN_DB_POOL_SIZE={args.pool_size})"), ("off", "pool off (WARDEN_DB_POOL_SIZE=0)")):
        r = comparison[name]
        print(f"  {label:<33} p50 {r['p50']:5.1f} ms, p95 {r['p95']:5.1f} ms, server cpu {r['server_cpu']:4.1f} ms")
    print(f"  opening a database connection (psycopg.connect, this machine): p50 {comparison['connect_p50']:.1f} ms, "
          f"p95 {comparison['connect_p95']:.1f} ms")

if __name__ == "__main__":
    main()
