"""Latency of the HTTP API's runs list (GET /api/v1/runs) over a million runs.

Seeds a separate database (warden_bench_api on the DATABASE_URL server): a few hundred users,
one "integrator" user owning half of all sessions (a service account that opens sessions for
its customers), an operator with `runs_app.view_run`, and `--runs` runs spread over a year,
with the shapes the check constraints demand (at most one active run per session). Rows are
generated in SQL (INSERT … SELECT generate_series), so seeding takes a few minutes, not hours.

Then it calls the endpoint in-process through django.test.Client with real API keys — the
full stack: URL routing, middleware, key lookup, permission check, query, serialisation — for
several callers and filter combinations, including deep keyset pages, and prints p50/p95
latency and queries per request. `cpu ms` is this process's CPU time per request (what the
request costs, whatever else the machine is doing); `sql ms` the time spent waiting on the
database. The test client keeps its connection between requests, as a pooled deployment would.

Usage: python bench/runs_list.py [--runs 1000000] [--requests 40] [--reuse] [--seed-only] [--explain]
"""

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
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
    finished_at, updated_at"""

# Run g (1..N) belongs to session (g-1) % S + 1 and is that session's k-th run, k = (g-1) / S;
# created_at grows with g over a year. Only a session's last run may be active (the partial
# unique index allows one); of those, 30% are: queued, running or waiting. The rest are
# completed (85%), failed (10%) or cancelled (5%).
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
    created + interval '9 seconds'
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


def measure(*, requests: int, explain: bool) -> list[dict]:
    from django.db import connection, reset_queries
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from sessions_app.api_keys import api_key_create
    from sessions_app.models import ApiKey, Session
    from django.contrib.auth import get_user_model

    User = get_user_model()
    ApiKey.objects.all().delete()
    keys = {
        "integrator": api_key_create(owner=User.objects.get(username="bench_integrator"), name="bench")[1],
        "small user": api_key_create(owner=User.objects.get(username="bench_user_7"), name="bench")[1],
        "operator": api_key_create(owner=User.objects.get(username="bench_operator"), name="bench")[1],
    }
    client = Client()

    def get(caller: str, query: str):
        return client.get(f"/api/v1/runs?{query}", HTTP_AUTHORIZATION=f"Bearer {keys[caller]}")

    def cursor_after(caller: str, pages: int) -> str:
        cursor = ""
        for _ in range(pages):
            body = get(caller, f"limit=50{'&cursor=' + cursor if cursor else ''}").json()
            cursor = body["next_cursor"]
        return cursor

    fill = {
        "session": str(Session.objects.filter(owner__username="bench_integrator").order_by("-created_at").values_list("id", flat=True)[3]),
        "integrator_cursor": cursor_after("integrator", 19),
        "operator_cursor": cursor_after("operator", 19),
    }
    results = []
    for caller, label, query in scenarios():
        query = query.format(**fill)
        first = get(caller, query)
        assert first.status_code == 200, (caller, query, first.status_code, first.content[:300])
        latencies, cpu_times, sql_times, counts = [], [], [], []
        for _ in range(requests):
            reset_queries()
            with CaptureQueriesContext(connection) as captured:
                c0, t0 = time.process_time(), time.perf_counter()
                response = get(caller, query)
                latencies.append((time.perf_counter() - t0) * 1000)
                cpu_times.append((time.process_time() - c0) * 1000)
            assert response.status_code == 200
            counts.append(len(captured.captured_queries))
            sql_times.append(sum(float(q["time"]) for q in captured.captured_queries) * 1000)
        results.append({
            "caller": caller, "scenario": label, "items": len(first.json()["items"]),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=40, help="timed requests per scenario")
    parser.add_argument("--reuse", action="store_true", help="keep an already seeded bench database")
    parser.add_argument("--seed-only", action="store_true")
    parser.add_argument("--explain", action="store_true", help="print EXPLAIN ANALYZE of each scenario's main query")
    args = parser.parse_args()

    url, existed = bench_database_url(reuse=args.reuse)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    settings.DEBUG = False
    call_command("migrate", verbosity=0)
    from runs_app.models import Run

    if not existed or not Run.objects.exists():
        print(f"seeding {args.runs} runs into {BENCH_DB}…", flush=True)
        seed(runs=args.runs)
    if args.seed_only:
        return
    total = Run.objects.count()
    load_before = f"{os.getloadavg()[0]:.2f}"
    results = measure(requests=args.requests, explain=args.explain)
    print(f"\nGET /api/v1/runs — {total:,} runs, {SESSIONS:,} sessions, {USERS + 2} users; "
          f"{args.requests} timed requests per row; {platform.node()}, {os.cpu_count()} CPUs, "
          f"{datetime.now().astimezone():%Y-%m-%d %H:%M %Z}\n")
    header = (f"| {'caller':<10} | {'scenario':<30} | {'items':>5} | {'p50 ms':>6} | {'p95 ms':>6} | {'cpu ms':>6} | "
              f"{'sql ms':>6} | {'queries':>7} |")
    print(header)
    print("|" + "|".join("-" * (len(cell)) for cell in header.split("|")[1:-1]) + "|")
    for r in results:
        print(f"| {r['caller']:<10} | {r['scenario']:<30} | {r['items']:>5} | {r['p50']:>6.1f} | {r['p95']:>6.1f} | "
              f"{r['cpu']:>6.1f} | {r['sql']:>6.1f} | {r['queries']:>7} |")
    pooled = [latency for r in results for latency in r["latencies"]]
    print(f"\nall {len(pooled)} requests: p50 {statistics.median(pooled):.1f} ms, p95 {percentile(pooled, 0.95):.1f} ms, "
          f"p99 {percentile(pooled, 0.99):.1f} ms; worst scenario p95 {max(r['p95'] for r in results):.1f} ms "
          f"(target p95 ≤ 30 ms); load average before/after {load_before} / {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
