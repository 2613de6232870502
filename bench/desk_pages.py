"""Server time of the operators' desk pages (every list, the dashboard, a run's page) at 100,000 runs.

Seeds a separate database (warden_bench_desk on the DATABASE_URL server) with the demo world's
shapes over the last 30 days: `--runs` runs in 20,000 sessions of 200 customers, each run with a
model step and a tool step, a query_order call (its order number in the arguments) and — for
the refunds — an execute_refund write with its idempotency key, its approval (pending, approved,
rejected or expired) and the audit entry of the decision; writes in doubt for the runs waiting
on reconciliation; three events and two messages per run. Outcomes as run_end sets them. Rows
are generated in SQL (INSERT … SELECT generate_series): a minute or two.

Then an operator (superuser, signed in) opens each page in-process through django.test.Client
— URL routing, middleware, the admin, the access policy, queries, template rendering — and the
script prints p50/p95 of the server time, the time spent in SQL and the number of queries.
The page budget is 300 ms at 100,000 runs. Run it by hand, never from the suite:

    DATABASE_URL=… nice -n 10 .venv/bin/python bench/desk_pages.py [--runs 100000] [--requests 15] [--reuse] [--explain]
"""

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BENCH_DB = "warden_bench_desk"
USERS = 200
SESSIONS = 20_000
BUDGET_MS = 300


def bench_database_url(*, reuse: bool) -> tuple[str, bool]:
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


# Run g belongs to session (g-1) % S + 1 and is its k-th run; only a session's last run may be
# active (30% of those are). A run is a refund (kind 'refund') two times in three, else a
# weather question. What became of a refund decides its approval, its write and its outcome.
SEED_PLAN_SQL = """
CREATE TABLE bench_plan AS
WITH numbered AS (
    SELECT g, ((g - 1) % {sessions}) + 1 AS sidx, (g - 1) / {sessions} AS k, random() AS r, random() AS r2, random() AS r3
    FROM generate_series(1, {runs}) AS g
)
SELECT n.g, gen_random_uuid() AS id, s.id AS session_id, s.owner_id,
    now() - interval '30 days' + (n.g * 2592000.0 / {runs}) * interval '1 second' - interval '10 minutes' AS created,
    CASE
        WHEN n.k = ({runs} - n.sidx) / {sessions} AND n.r < 0.03 THEN 'queued'
        WHEN n.k = ({runs} - n.sidx) / {sessions} AND n.r < 0.05 THEN 'running'
        WHEN n.k = ({runs} - n.sidx) / {sessions} AND n.r < 0.20 THEN 'waiting_approval'
        WHEN n.k = ({runs} - n.sidx) / {sessions} AND n.r < 0.22 THEN 'waiting_reconciliation'
        WHEN n.r2 < 0.85 THEN 'completed'
        WHEN n.r2 < 0.95 THEN 'failed'
        ELSE 'cancelled'
    END AS shape,
    CASE WHEN n.r3 < 0.67 THEN 'refund' ELSE 'weather' END AS kind,
    random() AS fate, 9000 + n.g AS order_number
FROM numbered n JOIN bench_session_index s ON s.sidx = n.sidx;
UPDATE bench_plan SET kind = 'refund' WHERE shape IN ('waiting_approval', 'waiting_reconciliation');
ALTER TABLE bench_plan ADD COLUMN status text, ADD COLUMN outcome text, ADD COLUMN write_status text, ADD COLUMN approval_status text;
UPDATE bench_plan SET status = CASE WHEN shape LIKE 'waiting%' THEN 'waiting' ELSE shape END;
UPDATE bench_plan SET
    approval_status = CASE
        WHEN kind <> 'refund' OR shape IN ('queued', 'running') THEN NULL
        WHEN shape = 'waiting_approval' THEN 'pending'
        WHEN shape = 'waiting_reconciliation' THEN 'approved'
        WHEN fate < 0.70 THEN 'approved' WHEN fate < 0.85 THEN 'rejected' WHEN fate < 0.95 THEN 'expired'
        ELSE 'approved' END;
UPDATE bench_plan SET
    write_status = CASE
        WHEN approval_status IS NULL THEN NULL
        WHEN shape = 'waiting_approval' THEN 'pending'
        WHEN shape = 'waiting_reconciliation' THEN 'unknown'
        WHEN approval_status IN ('rejected', 'expired') THEN 'cancelled'
        WHEN fate >= 0.95 THEN 'failed'
        WHEN status = 'completed' THEN 'succeeded'
        ELSE 'cancelled' END;
UPDATE bench_plan SET outcome = CASE
    WHEN status NOT IN ('completed', 'failed', 'cancelled') THEN ''
    WHEN write_status = 'succeeded' THEN 'applied'
    WHEN approval_status = 'rejected' THEN 'rejected'
    WHEN approval_status = 'expired' THEN 'expired'
    WHEN write_status IS NOT NULL THEN 'not_applied'
    ELSE 'none' END;
CREATE INDEX ON bench_plan (g);
ANALYZE bench_plan;
"""

SEED_ROWS_SQL = """
INSERT INTO runs_app_run (id, session_id, created_by_id, status, phase, wait_reason, wait_type, request_id, expires_at,
    resume_target, provider, provider_options, max_model_calls, model_calls, max_tokens, tokens_used, deadline,
    model_retries, lease_owner, lease_token, lease_expires_at, cancel_requested_at, cancel_requested_by_id, cancel_reason,
    error_code, error_detail, snapshot_version, event_seq, step_count, created_at, started_at, finished_at, updated_at, outcome)
SELECT id, session_id, owner_id, status,
    CASE status WHEN 'queued' THEN 'waiting_worker' WHEN 'running' THEN 'calling_model' ELSE '' END,
    CASE shape WHEN 'waiting_approval' THEN 'approval' WHEN 'waiting_reconciliation' THEN 'reconciliation' ELSE '' END,
    '', '', NULL, '', 'scripted', '{{}}'::jsonb, 20, 2, 200000, 120 + g % 200, created + interval '1 hour', 0,
    CASE status WHEN 'running' THEN 'bench-worker' ELSE '' END, 1,
    CASE status WHEN 'running' THEN now() + interval '30 seconds' END,
    CASE status WHEN 'cancelled' THEN created + interval '5 seconds' END, NULL, '',
    CASE status WHEN 'failed' THEN 'budget_model_calls' ELSE '' END, '', 5, 3, 2,
    created, created + interval '50 milliseconds',
    CASE WHEN status IN ('completed', 'failed', 'cancelled') THEN created + (2 + fate * 40) * interval '1 second' END,
    created + interval '9 seconds', outcome
FROM bench_plan;

INSERT INTO runs_app_step (index, kind, status, started_at, finished_at, input_tokens, output_tokens, finish_reason,
    context_manifest, discard_reason, lease_token, run_id, streamed_text)
SELECT 0, 'model', 'completed', created + interval '60 milliseconds', created + interval '400 milliseconds', 60, 20,
    'tool_calls', '{{}}'::jsonb, '', 1, id, '' FROM bench_plan
UNION ALL
SELECT 1, 'tools', CASE WHEN write_status IN ('pending', 'unknown') OR status IN ('queued', 'running') THEN 'running' ELSE 'completed' END,
    created + interval '400 milliseconds',
    CASE WHEN write_status IN ('pending', 'unknown') OR status IN ('queued', 'running') THEN NULL ELSE created + interval '2 seconds' END,
    0, 0, '', '{{}}'::jsonb, '', 1, id, '' FROM bench_plan;

CREATE TEMP TABLE bench_steps AS SELECT run_id, id AS step_id FROM runs_app_step WHERE index = 1;
CREATE INDEX ON bench_steps (run_id);

INSERT INTO tools_app_toolcall (id, index, tool_call_id, tool_name, arguments, effect, status, attempts, idempotency_key,
    result, error_code, error_detail, created_at, started_at, finished_at, next_attempt_at, reconcile_attempts, resolution,
    resolved_at, evidence, resolved_by_id, reused_from_id, run_id, step_id, lease_token)
SELECT gen_random_uuid(), 0, 'call_q_' || p.g,
    CASE p.kind WHEN 'refund' THEN 'query_order' ELSE 'get_weather' END,
    CASE p.kind WHEN 'refund' THEN jsonb_build_object('order_id', p.order_number::text)
        ELSE jsonb_build_object('city', (ARRAY['Paris', 'Rome', 'Lisbon', 'Oslo'])[1 + p.g % 4]) END,
    'read', 'succeeded', 1, NULL::varchar,
    CASE p.kind WHEN 'refund' THEN jsonb_build_object('order_id', p.order_number::text, 'amount', '25.00', 'refund_eligible', true)
        ELSE jsonb_build_object('summary', 'sunny', 'temperature_c', 21) END,
    '', '', p.created + interval '400 milliseconds', p.created + interval '400 milliseconds', p.created + interval '450 milliseconds',
    NULL::timestamptz, 0, '', NULL::timestamptz, '', NULL::integer, NULL::uuid, p.id, s.step_id, 1
FROM bench_plan p JOIN bench_steps s ON s.run_id = p.id
UNION ALL
SELECT gen_random_uuid(), 1, 'call_r_' || p.g, 'execute_refund',
    jsonb_build_object('order_id', p.order_number::text, 'amount', '25.00', 'reason', 'customer request'),
    'write', p.write_status, CASE WHEN p.write_status IN ('succeeded', 'failed', 'unknown') THEN 1 ELSE 0 END,
    'execute_refund:' || p.id || ':refund:' || p.order_number || ':25.00',
    CASE p.write_status WHEN 'succeeded' THEN jsonb_build_object('refund_id', 'rf_' || p.g, 'amount', '25.00') END,
    CASE p.write_status WHEN 'cancelled' THEN 'approval_' || p.approval_status WHEN 'failed' THEN 'not_eligible'
        WHEN 'unknown' THEN 'outcome_unknown' ELSE '' END,
    '', p.created + interval '450 milliseconds',
    CASE WHEN p.write_status IN ('succeeded', 'failed', 'unknown') THEN p.created + interval '5 minutes' END,
    CASE WHEN p.write_status IN ('succeeded', 'failed', 'cancelled', 'unknown') THEN p.created + interval '6 minutes' END,
    CASE p.write_status WHEN 'unknown' THEN now() + interval '1 minute' END,
    CASE p.write_status WHEN 'unknown' THEN 3 ELSE 0 END, '', NULL, '', NULL, NULL, p.id, s.step_id, 1
FROM bench_plan p JOIN bench_steps s ON s.run_id = p.id WHERE p.write_status IS NOT NULL;

INSERT INTO approvals_app_approval (id, policy, status, requested_at, expires_at, decided_at, note, decided_by_id, run_id,
    tool_call_id, customer_message)
SELECT gen_random_uuid(), 'operator', p.approval_status, c.created_at, c.created_at + interval '1 day',
    CASE WHEN p.approval_status = 'pending' THEN NULL
        WHEN p.approval_status = 'expired' THEN c.created_at + interval '1 day'
        ELSE c.created_at + (1 + p.fate * 20) * interval '1 minute' END,
    CASE WHEN p.approval_status IN ('approved', 'rejected') THEN 'checked the order' ELSE '' END,
    CASE WHEN p.approval_status IN ('approved', 'rejected') THEN {operator} END,
    p.id, c.id, ''
FROM bench_plan p JOIN tools_app_toolcall c ON c.run_id = p.id AND c.effect = 'write';

INSERT INTO approvals_app_auditentry (action, object_type, object_id, before, after, note, created_at, actor_id, run_id)
SELECT CASE a.status WHEN 'approved' THEN 'approve' ELSE 'reject' END, 'approval', a.id::text,
    '{{"status": "pending"}}'::jsonb, jsonb_build_object('status', a.status), a.note, a.decided_at, {operator}, a.run_id
FROM approvals_app_approval a WHERE a.status IN ('approved', 'rejected');

INSERT INTO runs_app_runevent (seq, type, payload, created_at, run_id)
SELECT e.seq, 'run_status', jsonb_build_object('status', e.status, 'phase', '', 'wait_reason', ''), p.created + e.seq * interval '1 second', p.id
FROM bench_plan p, LATERAL (VALUES (1, 'queued'), (2, 'running'), (3, p.status)) AS e(seq, status);

INSERT INTO sessions_app_message (seq, role, content, tool_calls, tool_call_id, tool_name, created_at, run_id, step_id, session_id)
SELECT (p.g - 1) / {sessions} * 2 + m.n, m.role,
    CASE WHEN m.role = 'user' THEN CASE p.kind WHEN 'refund' THEN 'Check order ' || p.order_number || ' and refund it if it''s eligible'
        ELSE 'What''s the weather?' END ELSE 'Done.' END,
    '[]'::jsonb, '', '', p.created, p.id, NULL, p.session_id
FROM bench_plan p, LATERAL (VALUES (1, 'user'), (2, 'assistant')) AS m(n, role);
UPDATE sessions_app_session s SET message_seq = m.top FROM (
    SELECT session_id, max(seq) AS top FROM sessions_app_message GROUP BY session_id) m WHERE m.session_id = s.id;
"""


def seed(*, runs: int) -> None:
    from django.contrib.auth import get_user_model
    from django.db import connection

    User = get_user_model()
    started = time.perf_counter()
    users = User.objects.bulk_create([User(username=f"customer_{i}", password="!") for i in range(USERS)])
    operator = User.objects.create_superuser("bench_operator", password="bench-operator-pass")
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO sessions_app_session (id, owner_id, title, message_seq, created_at, updated_at)
            SELECT gen_random_uuid(), %(first_user)s + (g %% %(users)s),
                   CASE WHEN g %% 3 = 0 THEN 'Weather' ELSE 'Refund for order ' || (9000 + g) END, 0,
                   now() - interval '31 days' + g * interval '1 second', now()
            FROM generate_series(1, %(sessions)s) AS g
            """,
            {"sessions": SESSIONS, "first_user": users[0].pk, "users": USERS},
        )
        cursor.execute("CREATE TEMP TABLE bench_session_index AS "
                       "SELECT row_number() OVER (ORDER BY created_at, id) AS sidx, id, owner_id FROM sessions_app_session")
        cursor.execute("CREATE INDEX ON bench_session_index (sidx)")
        cursor.execute("ANALYZE bench_session_index")
        cursor.execute(SEED_PLAN_SQL.format(sessions=SESSIONS, runs=runs))
        print(f"  plan: {time.perf_counter() - started:.1f}s", flush=True)
        for statement in SEED_ROWS_SQL.format(sessions=SESSIONS, operator=operator.pk).split(";\n"):
            if statement.strip():
                cursor.execute(statement)
        cursor.execute("DROP TABLE bench_plan")
        print(f"  {runs} runs and their parts: {time.perf_counter() - started:.1f}s", flush=True)
    connection.close()
    import psycopg

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    print(f"  vacuum analyze: {time.perf_counter() - started:.1f}s", flush=True)


def pages(fill: dict) -> list[tuple[str, str]]:
    """(label, path) of every desk list and the dashboard; `{...}` is filled from the data."""
    return [
        ("dashboard (index)", "/admin/"),
        ("approval queue", "/admin/approvals_app/approval/"),
        ("approval queue, pending", "/admin/approvals_app/approval/?status__exact=pending"),
        ("approval queue, search order", "/admin/approvals_app/approval/?q={order}"),
        ("runs", "/admin/runs_app/run/"),
        ("runs, status=waiting", "/admin/runs_app/run/?status__exact=waiting"),
        ("runs, write did not happen", "/admin/runs_app/run/?outcome=did_not_happen"),
        ("runs, search order number", "/admin/runs_app/run/?q={order}"),
        ("runs, search customer", "/admin/runs_app/run/?q={customer}"),
        ("runs, search session title", "/admin/runs_app/run/?q=Refund+for+order+{title_order}"),
        ("runs, page 50", "/admin/runs_app/run/?p=50"),
        ("run detail", "/admin/runs_app/run/{run}/change/"),
        ("unknown calls", "/admin/tools_app/unknowntoolcall/"),
        ("tool calls", "/admin/tools_app/toolcall/"),
        ("tool calls, search key", "/admin/tools_app/toolcall/?q={key}"),
        ("audit trail", "/admin/approvals_app/auditentry/"),
        ("sessions", "/admin/sessions_app/session/"),
        ("sessions, search order", "/admin/sessions_app/session/?q={order}"),
        ("messages", "/admin/sessions_app/message/"),
        ("pending inputs", "/admin/sessions_app/pendinginput/"),
        ("steps", "/admin/runs_app/step/"),
        ("run events", "/admin/runs_app/runevent/"),
        ("context summaries", "/admin/runs_app/contextsummary/"),
        ("API keys", "/admin/sessions_app/apikey/"),
    ]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(*, requests: int, explain: bool) -> list[dict]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from runs_app.models import Run
    from tools_app.models import ToolCall

    client = Client()
    client.force_login(get_user_model().objects.get(username="bench_operator"))
    refund = ToolCall.objects.filter(tool_name="execute_refund").order_by("-created_at")[500]
    fill = {
        "order": refund.arguments["order_id"],
        "key": refund.idempotency_key,
        "customer": "customer_77",
        "title_order": 9000 + SESSIONS - 7,
        "run": Run.objects.order_by("-created_at").values_list("pk", flat=True)[10],
    }
    results = []
    for label, path in pages(fill):
        path = path.format(**fill)
        first = client.get(path)
        assert first.status_code == 200, (path, first.status_code)
        latencies, sql_times, counts = [], [], []
        for _ in range(requests):
            with CaptureQueriesContext(connection) as captured:
                t0 = time.perf_counter()
                response = client.get(path)
                latencies.append((time.perf_counter() - t0) * 1000)
            assert response.status_code == 200
            counts.append(len(captured.captured_queries))
            sql_times.append(sum(float(q["time"]) for q in captured.captured_queries) * 1000)
        results.append({"page": label, "path": path, "p50": statistics.median(latencies), "p95": percentile(latencies, 0.95),
                        "sql": statistics.median(sql_times), "queries": max(counts), "latencies": latencies})
        if explain:
            with CaptureQueriesContext(connection) as captured:
                client.get(path)
            slowest = max(captured.captured_queries, key=lambda q: float(q["time"]))
            print(f"\n-- {label}: slowest query {float(slowest['time']) * 1000:.1f} ms\n{slowest['sql'][:600]}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=15, help="timed requests per page")
    parser.add_argument("--reuse", action="store_true", help="keep an already seeded bench database")
    parser.add_argument("--seed-only", action="store_true")
    parser.add_argument("--explain", action="store_true", help="print each page's slowest query")
    args = parser.parse_args()

    url, existed = bench_database_url(reuse=args.reuse)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("WARDEN_DEMO", "0")
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
    from approvals_app.models import Approval
    from tools_app.models import ToolCall

    counts = f"{Run.objects.count():,} runs, {ToolCall.objects.count():,} tool calls, {Approval.objects.count():,} approvals"
    load_before = " / ".join(f"{value:.2f}" for value in os.getloadavg())
    results = measure(requests=args.requests, explain=args.explain)
    print(f"\nDesk pages — {counts}; {args.requests} timed requests per page; {platform.node()}, {os.cpu_count()} CPUs, "
          f"{datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; load average (1/5/15 min) before {load_before}, "
          f"after {' / '.join(f'{value:.2f}' for value in os.getloadavg())}\n")
    header = f"| {'page':<30} | {'p50 ms':>6} | {'p95 ms':>6} | {'sql ms':>6} | {'queries':>7} |"
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    for r in results:
        print(f"| {r['page']:<30} | {r['p50']:>6.1f} | {r['p95']:>6.1f} | {r['sql']:>6.1f} | {r['queries']:>7} |")
    worst = max(results, key=lambda r: r["p95"])
    print(f"\nworst p95: {worst['page']} {worst['p95']:.1f} ms (budget {BUDGET_MS} ms); "
          f"{'every page within budget' if worst['p95'] <= BUDGET_MS else 'OVER BUDGET'}")


if __name__ == "__main__":
    main()
