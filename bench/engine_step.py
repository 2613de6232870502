"""Per-step overhead of Warden's run engine against the PostgreSQL commit floor, in one run.

A "run" is the benchmark conversation "please run noop K": a zero-latency scripted model asks
for K no-op read tools one after another, then answers — K+1 model steps and K read tool
calls, each a durable step. The engine is driven exactly as a worker task drives it
(`run_drive`), in this process, so queue pickup latency is not part of the figure (it is a
separate cost: django-q2's poll interval). The floor is one INSERT + COMMIT per step
(BEGIN/INSERT/COMMIT, synchronous_commit on) through psycopg on the same database — the same
floor as ../shared/bench/peers/floor.py "txn, sync_commit=on". Rounds alternate floor and
engine so both see the same machine.

Counted per step, over the timed section: write transactions (xids handed out), WAL bytes
(pg_current_wal_lsn delta), SQL statements sent by the engine, client CPU.

`--telemetry on` measures the same with issue 15's telemetry switched on in the bench process:
OpenTelemetry tracing (spans for each slice, model call and tool call, plus the psycopg
instrumentation) exported through the SDK's batch processor to an exporter that drops spans,
JSON log lines for warden.* at INFO written to /dev/null, and a /metrics scrape (the PostgreSQL
collectors) once per round. Metrics cost the engine nothing per step otherwise (they are read
from the tables at scrape time), so the difference is tracing and logging.

Usage: python bench/engine_step.py [--runs 20] [--rounds 5] [--noops 10] [--layer configured|none] [--telemetry off|on]
                                   [--json PATH]
Needs DATABASE_URL (or the embedded server). Uses (and re-creates) the database warden_bench.
"""

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BENCH_DB = "warden_bench"


def bench_database_url() -> str:
    base = os.environ.get("DATABASE_URL")
    if not base:
        from config.embedded_db import embedded_database_url

        base = embedded_database_url(ROOT)
    parts = urlsplit(base)
    admin = urlunsplit(parts._replace(path="/postgres"))
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    return urlunsplit(parts._replace(path=f"/{BENCH_DB}"))


def counters(conn) -> tuple[int, int]:
    row = conn.execute(
        "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
    ).fetchone()
    return int(row[0]), int(row[1])


def floor_round(conn, steps: int) -> dict:
    from psycopg.types.json import Jsonb

    payload = {"step": 0, "ok": True, "tool": "noop", "note": "x" * 150}
    run_id = uuid.uuid4()
    x0, w0 = counters(conn)
    conn.commit()
    cpu0, t0 = time.process_time(), time.perf_counter()
    for step in range(steps):
        conn.execute("INSERT INTO bench_floor (run_id, step_id, output) VALUES (%s, %s, %s)", (run_id, step, Jsonb(payload)))
        conn.commit()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    x1, w1 = counters(conn)
    conn.commit()
    return {"us": wall / steps * 1e6, "cpu_us": cpu / steps * 1e6, "xids": (x1 - x0 - 1) / steps, "wal": (w1 - w0) / steps}


def engine_round(runs: int, noops: int, user, monitor) -> dict:
    from django.db import connection

    from engine.loop import run_drive
    from runs_app.models import Run, RunStatus
    from engine.actions.messages import message_post
    from engine.actions.sessions import session_open

    prepared = []
    for _ in range(runs):
        session = session_open(owner=user, title="bench")
        prepared.append(message_post(session=session, content=f"please run noop {noops}", acting_user=user,
                                     provider_options={"delay": 0}).run.id)
    statements = [0]

    def count(execute, sql, params, many, context):
        statements[0] += 1
        return execute(sql, params, many, context)

    x0, w0 = counters(monitor)
    monitor.commit()
    cpu0, t0 = time.process_time(), time.perf_counter()
    with connection.execute_wrapper(count):
        for run_id in prepared:
            outcome = run_drive(run_id=str(run_id))
            assert outcome == "completed", outcome
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    x1, w1 = counters(monitor)
    monitor.commit()
    steps = runs * (2 * noops + 1)
    done = Run.objects.filter(pk__in=prepared, status=RunStatus.COMPLETED).count()
    assert done == runs, f"{done} of {runs} runs completed"
    return {"us": wall / steps * 1e6, "cpu_us": cpu / steps * 1e6, "xids": (x1 - x0 - 1) / steps,
            "wal": (w1 - w0) / steps, "statements": statements[0] / steps}


def telemetry_on():
    """Tracing with every span exported (to nowhere) through the batch processor, as in production,
    JSON logs at INFO to /dev/null; returns a function that scrapes the metrics once."""
    import logging

    from django.db import connection
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from prometheus_client import REGISTRY, generate_latest

    from config.logs import JsonFormatter, RunContextFilter
    from config.tracing import tracing_setup
    from operations.metrics import COLLECTOR

    class Dropping(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    tracing_setup(exporter=Dropping(), batch=True)
    connection.close()  # reconnect through the psycopg instrumentation
    handler = logging.FileHandler(os.devnull)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RunContextFilter())
    warden = logging.getLogger("warden")
    warden.handlers = [handler]
    warden.setLevel(logging.INFO)
    warden.propagate = False
    try:
        REGISTRY.register(COLLECTOR)
    except ValueError:
        pass
    return lambda: generate_latest(REGISTRY)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--noops", type=int, default=10)
    parser.add_argument("--layer", choices=["configured", "none"], default="configured",
                        help="live publishing through the configured Channels layer, or none (publishing off)")
    parser.add_argument("--telemetry", choices=["off", "on"], default="off",
                        help="tracing (spans to a dropping exporter), JSON logs to /dev/null and a scrape per round")
    parser.add_argument("--json", type=Path, help="also write the result document here (bench/compare.py reads it)")
    args = parser.parse_args()
    if args.telemetry == "off":
        os.environ.setdefault("WARDEN_LOG_LEVEL", "WARNING")
        for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
            os.environ.pop(name, None)

    url = bench_database_url()
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("WARDEN_DEMO", "1")  # the demo world's noop tool
    os.environ.setdefault("WARDEN_LEASE_SECONDS", "60")
    os.environ["WARDEN_SCRIPTED_DELAY_SECONDS"] = "0"
    import django
    from django.conf import settings

    django.setup()
    if args.layer == "none":
        settings.CHANNEL_LAYERS = {}
        from channels import layers

        layers.channel_layers.backends.clear()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create(username="bench")
    scrape = telemetry_on() if args.telemetry == "on" else (lambda: None)

    import psycopg

    floor_conn = psycopg.connect(url)
    floor_conn.execute("CREATE TABLE bench_floor (run_id uuid, step_id int, output jsonb, created_at timestamptz DEFAULT now(), PRIMARY KEY (run_id, step_id))")
    floor_conn.commit()
    monitor = psycopg.connect(url)
    steps = args.runs * (2 * args.noops + 1)
    floor_round(floor_conn, 50)  # warm-up
    engine_round(2, args.noops, user, monitor)

    floors, engines = [], []
    for round_no in range(args.rounds):
        floors.append(floor_round(floor_conn, steps))
        engines.append(engine_round(args.runs, args.noops, user, monitor))
        scrape()
        print(f"round {round_no + 1}: floor {floors[-1]['us']:.0f} µs/step, engine {engines[-1]['us']:.0f} µs/step", file=sys.stderr)

    def med(rows, key):
        return statistics.median(r[key] for r in rows)

    layer = "none" if args.layer == "none" else settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1]
    result = {
        "runs_per_round": args.runs, "rounds": args.rounds, "steps_per_run": 2 * args.noops + 1, "layer": layer,
        "telemetry": args.telemetry,
        "floor": {k: med(floors, k) for k in floors[0]},
        "floor_min_max": [min(r["us"] for r in floors), max(r["us"] for r in floors)],
        "engine": {k: med(engines, k) for k in engines[0]},
        "engine_min_max": [min(r["us"] for r in engines), max(r["us"] for r in engines)],
    }
    result["ratio"] = result["engine"]["us"] / result["floor"]["us"]
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    print(
        f"\ntelemetry {args.telemetry}\n| layer | floor µs/step (median) | engine µs/step (median, min–max) | ratio | write txns/step | WAL B/step | SQL stmts/step | engine CPU µs/step |\n"
        f"|---|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| {layer} | {result['floor']['us']:.0f} | {result['engine']['us']:.0f} ({result['engine_min_max'][0]:.0f}–{result['engine_min_max'][1]:.0f}) "
        f"| {result['ratio']:.2f}× | {result['engine']['xids']:.2f} (floor {result['floor']['xids']:.2f}) | {result['engine']['wal']:.0f} (floor {result['floor']['wal']:.0f}) "
        f"| {result['engine']['statements']:.1f} | {result['engine']['cpu_us']:.0f} |"
    )
    floor_conn.close()
    monitor.close()


if __name__ == "__main__":
    main()
