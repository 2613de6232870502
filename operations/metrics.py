"""Prometheus metrics read from PostgreSQL at scrape time (docs/OPERATIONS.md, "Metrics").

Every number comes from the database — the runs, steps, tool calls, approvals and deliveries
themselves, and the heartbeat rows where each process keeps its own counters — so every web
process answers a scrape with the same truth, whichever one the load balancer picks. A process
reads at most once per WARDEN_METRICS_CACHE_SECONDS, in one read-only transaction whose
statements may take at most METRICS_STATEMENT_TIMEOUT_MS each.

Counters and histograms derived from rows (runs, steps, tool calls, tokens) only grow, because
Warden never deletes those rows; those kept in heartbeat rows are summed over every process that
ever ran (dead ones included), so they do not drop when a worker is recycled.
"""

import json
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from operations.liveness import HISTOGRAM_BUCKETS
from operations.models import ProcessRole

METRICS_STATEMENT_TIMEOUT_MS = 5000

RUN_DURATION_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600)
APPROVAL_DECISION_BUCKETS = (10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 2 * 3600, 4 * 3600, 8 * 3600, 24 * 3600)
STEP_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

# A model step discarded this way never called the model (engine.loop.Driver.yield_slice).
_NOT_A_CALL = "time slice used before the model was called"


def _rows(cursor, sql: str, params=()) -> list[tuple]:
    cursor.execute(sql, params)
    return cursor.fetchall()


def _histogram_sql(*, table: str, duration: str, label: str, buckets, where: str) -> str:
    counts = ", ".join(f"count(*) FILTER (WHERE d <= {b})" for b in buckets)
    return (f"SELECT label, {counts}, count(*), coalesce(sum(d), 0) FROM ("
            f"SELECT {label} AS label, extract(epoch FROM {duration})::float8 AS d FROM {table} WHERE {where}) t "
            "GROUP BY label ORDER BY label")


def _histogram(name: str, documentation: str, label: str, rows, buckets) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=[label])
    for row in rows:
        cumulative = [(str(float(b)), row[1 + i]) for i, b in enumerate(buckets)] + [("+Inf", row[1 + len(buckets)])]
        family.add_metric([row[0]], cumulative, sum_value=row[-1])
    return family


def _process_totals(rows, now) -> tuple[dict, dict, dict]:
    """Sum the heartbeat rows: counters over every row, gauges over fresh rows, live processes
    by role."""
    counters: dict[str, object] = {}
    gauges: dict[str, int] = {}
    alive: dict[str, int] = {role: 0 for role in ProcessRole.values}
    stale = {ProcessRole.WORKER: settings.WARDEN_WORKER_STALE_SECONDS, ProcessRole.WEB: settings.WARDEN_WORKER_STALE_SECONDS,
             ProcessRole.SWEEPER: settings.WARDEN_SWEEPER_STALE_SECONDS}
    for role, beat_at, row_counters, row_gauges in rows:
        # Django's psycopg setup hands jsonb to raw cursors as text.
        row_counters = json.loads(row_counters) if isinstance(row_counters, str) else row_counters
        row_gauges = json.loads(row_gauges) if isinstance(row_gauges, str) else row_gauges
        fresh = now - beat_at <= timedelta(seconds=stale.get(role, settings.WARDEN_WORKER_STALE_SECONDS))
        if fresh:
            alive[role] = alive.get(role, 0) + 1
            for key, value in (row_gauges or {}).items():
                gauges[key] = gauges.get(key, 0) + value
        for key, value in (row_counters or {}).items():
            if isinstance(value, dict):
                total = counters.setdefault(key, {"buckets": [0] * len(value["buckets"]), "sum": 0.0, "count": 0})
                total["buckets"] = [a + b for a, b in zip(total["buckets"], value["buckets"])]
                total["sum"] += value["sum"]
                total["count"] += value["count"]
            else:
                counters[f"{role}:{key}"] = counters.get(f"{role}:{key}", 0) + value
    return counters, gauges, alive


def read_families() -> list:
    """Every Warden metric family, read now."""
    now = timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL statement_timeout = {METRICS_STATEMENT_TIMEOUT_MS}")
        cursor.execute("SET TRANSACTION READ ONLY")
        runs = _rows(cursor, 'SELECT status, phase, wait_reason, count(*) FROM "runs_app_run" GROUP BY 1, 2, 3 ORDER BY 1, 2, 3')
        run_durations = _rows(cursor, _histogram_sql(
            table='"runs_app_run"', duration='"finished_at" - "created_at"', label='"status"', buckets=RUN_DURATION_BUCKETS,
            where='"finished_at" IS NOT NULL'))
        step_durations = _rows(cursor, _histogram_sql(
            table='"runs_app_step"', duration='"finished_at" - "started_at"', label='"kind"', buckets=STEP_DURATION_BUCKETS,
            where='"finished_at" IS NOT NULL'))
        model_calls = _rows(cursor, """
            SELECT r."provider", coalesce(r."provider_options"->>'agent', 'default'), count(*),
                   coalesce(sum(s."input_tokens"), 0), coalesce(sum(s."output_tokens"), 0)
            FROM "runs_app_step" s JOIN "runs_app_run" r ON r."id" = s."run_id"
            WHERE s."kind" = 'model' AND NOT (s."status" = 'discarded' AND s."discard_reason" = %s)
            GROUP BY 1, 2 ORDER BY 1, 2""", [_NOT_A_CALL])
        tool_calls = _rows(cursor, 'SELECT "tool_name", "effect", "status", count(*) FROM "tools_app_toolcall" GROUP BY 1, 2, 3 ORDER BY 1, 2, 3')
        approvals = _rows(cursor, """SELECT "policy", count(*), min("requested_at") FROM "approvals_app_approval"
                                     WHERE "status" = 'pending' GROUP BY 1""")
        decision_times = _rows(cursor, _histogram_sql(
            table='"approvals_app_approval"', duration='"decided_at" - "requested_at"', label='"policy"',
            buckets=APPROVAL_DECISION_BUCKETS, where='"status" IN (\'approved\', \'rejected\') AND "decided_at" IS NOT NULL'))
        approval_escalations = _rows(cursor, """SELECT "policy", count(*) FROM "approvals_app_approval"
                                                WHERE "escalated_at" IS NOT NULL GROUP BY 1 ORDER BY 1""")
        emails = _rows(cursor, """SELECT "kind", "status", count(*) FROM "notifications_emaildelivery"
                                  GROUP BY 1, 2 ORDER BY 1, 2""")
        unknown = _rows(cursor, """SELECT "tool_name", count(*), min(coalesce("finished_at", "started_at", "created_at"))
                                   FROM "tools_app_toolcall" WHERE "status" = 'unknown' GROUP BY 1""")
        escalated = _rows(cursor, """SELECT count(*) FROM "tools_app_toolcall" WHERE "status" = 'unknown'
                                     AND "next_attempt_at" IS NULL""")[0][0]
        deliveries = _rows(cursor, """SELECT "kind", "status", count(*), coalesce(sum("attempts"), 0) FROM "runs_app_webhookdelivery"
                                      GROUP BY 1, 2 ORDER BY 1, 2""")
        oldest_delivery = _rows(cursor, """SELECT min("created_at") FROM "runs_app_webhookdelivery" WHERE "status" = 'pending'""")[0][0]
        processes = _rows(cursor, 'SELECT "role", "beat_at", "counters", "gauges" FROM "runs_app_processheartbeat"')
    db_now = now
    families = []

    family = GaugeMetricFamily("warden_runs", "Runs by status, phase and wait reason, now.", labels=["status", "phase", "wait_reason"])
    for status, phase, wait_reason, n in runs:
        family.add_metric([status, phase, wait_reason], n)
    families.append(family)
    families.append(_histogram("warden_run_duration_seconds", "Ended runs: creation to end (waiting for people included).",
                               "status", run_durations, RUN_DURATION_BUCKETS))
    families.append(_histogram("warden_step_duration_seconds", "Finished steps: a model call or a batch of tool calls.",
                               "kind", step_durations, STEP_DURATION_BUCKETS))

    calls = CounterMetricFamily("warden_model_calls", "Model calls made.", labels=["provider", "agent"])
    tokens = CounterMetricFamily("warden_model_tokens", "Tokens the providers reported.", labels=["provider", "agent", "direction"])
    cost = CounterMetricFamily("warden_model_cost_usd", "Model cost in US dollars, from WARDEN_MODEL_PRICES.", labels=["provider", "agent"])
    for provider, agent, n, input_tokens, output_tokens in model_calls:
        calls.add_metric([provider, agent], n)
        tokens.add_metric([provider, agent, "input"], input_tokens)
        tokens.add_metric([provider, agent, "output"], output_tokens)
        price = settings.WARDEN_MODEL_PRICES.get(provider, {})
        cost.add_metric([provider, agent], (input_tokens * float(price.get("input", 0)) + output_tokens * float(price.get("output", 0))) / 1e6)
    families += [calls, tokens, cost]

    finished = CounterMetricFamily("warden_tool_calls", "Tool calls that reached an outcome.", labels=["tool", "effect", "outcome"])
    open_calls = GaugeMetricFamily("warden_tool_calls_open", "Tool calls not finished, now.", labels=["tool", "effect", "status"])
    for tool, effect, status, n in tool_calls:
        (finished if status in ("succeeded", "failed", "cancelled") else open_calls).add_metric([tool, effect, status], n)
    families += [finished, open_calls]

    pending = GaugeMetricFamily("warden_approvals_pending", "Approval requests waiting for a decision.", labels=["policy"])
    oldest = GaugeMetricFamily("warden_approval_oldest_pending_age_seconds", "Age of the oldest pending approval request.", labels=["policy"])
    for policy, n, since in approvals:
        pending.add_metric([policy], n)
        oldest.add_metric([policy], max(0.0, (db_now - since).total_seconds()))
    families += [pending, oldest]
    families.append(_histogram("warden_approval_decision_seconds",
                               "Decided approvals (approved or rejected): request to decision, by tier.",
                               "policy", decision_times, APPROVAL_DECISION_BUCKETS))
    escalations = CounterMetricFamily("warden_approval_escalations",
                                      "Approvals escalated past their service level, by tier.", labels=["policy"])
    for policy, n in approval_escalations:
        escalations.add_metric([policy], n)
    families.append(escalations)

    unknown_calls = GaugeMetricFamily("warden_unknown_tool_calls", "Writes whose outcome is unknown (waiting for reconciliation).", labels=["tool"])
    unknown_age = GaugeMetricFamily("warden_unknown_tool_call_oldest_age_seconds", "Age of the oldest unknown write.", labels=["tool"])
    for tool, n, since in unknown:
        unknown_calls.add_metric([tool], n)
        unknown_age.add_metric([tool], max(0.0, (db_now - since).total_seconds()))
    families += [unknown_calls, unknown_age,
                 GaugeMetricFamily("warden_unknown_tool_calls_for_people", "Unknown writes automatic reconciliation gave up on.", value=escalated)]

    sent = CounterMetricFamily("warden_webhook_deliveries", "Webhook deliveries by kind and status.", labels=["kind", "status"])
    attempts = CounterMetricFamily("warden_webhook_attempts", "Webhook delivery attempts made.", labels=["kind"])
    attempts_by_kind: dict[str, int] = {}
    for kind, status, n, tries in deliveries:
        sent.add_metric([kind, status], n)
        attempts_by_kind[kind] = attempts_by_kind.get(kind, 0) + tries
    for kind, tries in attempts_by_kind.items():
        attempts.add_metric([kind], tries)
    families += [sent, attempts, GaugeMetricFamily(
        "warden_webhook_oldest_pending_age_seconds", "Age of the oldest webhook delivery not yet delivered.",
        value=max(0.0, (db_now - oldest_delivery).total_seconds()) if oldest_delivery else 0.0)]

    mails = CounterMetricFamily("warden_email_deliveries", "E-mail deliveries by kind and status.", labels=["kind", "status"])
    for kind, status, n in emails:
        mails.add_metric([kind, status], n)
    families.append(mails)

    counters, gauges, alive = _process_totals(processes, db_now)
    live = GaugeMetricFamily("warden_processes", "Processes with a fresh heartbeat, by role.", labels=["role"])
    for role, n in sorted(alive.items()):
        live.add_metric([role], n)
    families.append(live)
    tasks = CounterMetricFamily("warden_worker_tasks", "Worker tasks by what became of them.", labels=["outcome"])
    for key, value in sorted(counters.items()):
        if key.startswith("worker:tasks:"):
            tasks.add_metric([key.removeprefix("worker:tasks:")], value)
    families.append(tasks)
    families.append(CounterMetricFamily(
        "warden_fenced_writes_refused", "Writes refused because the worker's lease token was no longer the run's.",
        value=counters.get("worker:fenced_writes_refused", 0)))
    families.append(CounterMetricFamily("warden_sweeps", "Sweeper passes.", value=counters.get("sweeper:sweeps", 0)))
    families.append(CounterMetricFamily(
        "warden_lease_takeovers", "Leases the sweeper revoked from a silent worker, handing the run to another.",
        value=counters.get("sweeper:leases_revoked", 0)))
    actions = CounterMetricFamily("warden_sweep_actions", "What sweeps did.", labels=["action"])
    for key, value in sorted(counters.items()):
        if key.startswith("sweeper:") and key != "sweeper:sweeps":
            actions.add_metric([key.removeprefix("sweeper:")], value)
    families.append(actions)
    pickup = counters.get("queue_pickup_seconds")
    bounds = HISTOGRAM_BUCKETS["queue_pickup_seconds"]
    family = HistogramMetricFamily("warden_queue_pickup_seconds", "From queued to claimed by a worker.")
    if isinstance(pickup, dict):
        running, cumulative = 0, []
        for bound, n in zip(bounds, pickup["buckets"]):
            running += n
            cumulative.append((str(float(bound)), running))
        family.add_metric([], cumulative + [("+Inf", pickup["count"])], sum_value=pickup["sum"])
    else:
        family.add_metric([], [(str(float(b)), 0) for b in bounds] + [("+Inf", 0)], sum_value=0)
    families.append(family)
    clients = GaugeMetricFamily("warden_live_clients", "Connected live clients, by transport.", labels=["transport"])
    clients.add_metric(["websocket"], gauges.get("websocket_clients", 0))
    clients.add_metric(["sse"], gauges.get("sse_clients", 0))
    families.append(clients)
    families.append(GaugeMetricFamily(
        "warden_runs_in_flight", "Runs the worker processes drive at this moment (each process up to WARDEN_RUNS_PER_WORKER).",
        value=gauges.get("runs_in_flight", 0)))
    return families


class WardenCollector:
    """A prometheus_client collector: the families above, cached per process."""

    def __init__(self):
        self._lock = threading.Lock()
        self._cached: tuple[float, list] | None = None

    def describe(self):
        return []  # no names up front: registering must not query the database

    def collect(self):
        with self._lock:
            if self._cached is None or time.monotonic() - self._cached[0] >= settings.WARDEN_METRICS_CACHE_SECONDS:
                self._cached = (time.monotonic(), read_families())
            families = self._cached[1]
        yield from families

    def clear(self) -> None:
        with self._lock:
            self._cached = None


COLLECTOR = WardenCollector()
