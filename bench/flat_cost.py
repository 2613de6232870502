"""Issue 16 goal 2: the engine's cost per step stays flat as work grows.

Two figures, both the engine's own time per durable step — each pass of the worker loop
(`Driver.advance`) less the time spent inside the model provider's stream and the tool itself,
which are the work, not the engine's bookkeeping — as wall time and as this process's CPU time:
- long runs: "please run noop N" (2N+1 steps): the cost of step 2N against step 5 on the
  least-squares line through every step's cost (the median over the runs), beside the medians of
  the first and the last fifty steps;
- a model step in a session whose history holds 10,000 messages against one holding 10: runs of
  "please run noop 5", one in a small and one in a large session per round, in an order that
  alternates from round to round, each in a session of its own (made beforehand, with one run
  already behind it, which may have summarized the history), so both sizes see the same machine.

The machine is shared and noisy: medians over many passes, both sizes interleaved. The ratio of
SQL statements and of bytes sent per model step says the same without the clock.

Usage: python bench/flat_cost.py [--noops 250] [--long-runs 3] [--history 10000] [--rounds 12] [--json PATH]
Needs DATABASE_URL (or the embedded server); uses (and re-creates) the database warden_bench_flat.
"""

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


class Meter:
    """Per pass of the worker loop: its wall and CPU time less the time inside the provider and
    the tool, and the SQL statements it sent."""

    def __init__(self):
        self.outside = [0.0, 0.0]
        self.statements = 0
        # (kind of the step the pass advanced, engine wall seconds, engine CPU seconds, statements)
        self.passes: list[tuple[str, float, float, int]] = []

    def add_outside(self, since: tuple[float, float]) -> None:
        now = clocks()
        self.outside[0] += now[0] - since[0]
        self.outside[1] += now[1] - since[1]


def instrument(meter: Meter):
    import engine.loop as loop
    import engine.model_step as model_step
    from django.db import connection
    from tools_app import registry

    advance = loop.Driver.advance

    def count(execute, sql, params, many, context):
        meter.statements += 1
        return execute(sql, params, many, context)

    def timed_advance(self, cp):
        meter.outside = [0.0, 0.0]
        meter.statements = 0
        kind = "tools" if cp.open_tool_calls else "model"
        started = clocks()
        try:
            with connection.execute_wrapper(count):
                return advance(self, cp)
        finally:
            ended = clocks()
            meter.passes.append((kind, ended[0] - started[0] - meter.outside[0],
                                 ended[1] - started[1] - meter.outside[1], meter.statements))

    loop.Driver.advance = timed_advance

    real_get_provider = model_step.get_provider

    class TimedProvider:
        def __init__(self, provider):
            self._provider = provider

        def __getattr__(self, name):
            return getattr(self._provider, name)

        def stream(self, request):
            started = clocks()
            events = iter(self._provider.stream(request))
            meter.add_outside(started)
            while True:
                started = clocks()
                try:
                    event = next(events)
                except StopIteration:
                    meter.add_outside(started)
                    return
                meter.add_outside(started)
                yield event

    model_step.get_provider = lambda name, **kwargs: TimedProvider(real_get_provider(name, **kwargs))
    tool = registry.tool_get("noop")

    def timed_noop(ctx, args):
        started = clocks()
        try:
            return tool.execute(ctx, args)
        finally:
            meter.add_outside(started)

    # The tool runs in a thread of its own, which the pass waits for: its time is outside too.
    registry._REGISTRY["noop"] = dataclasses.replace(tool, execute=timed_noop)


def drive_to_end(run_id) -> str:
    from engine.loop import run_drive
    from runs_app.models import Run, RunStatus

    for _ in range(100):
        outcome = run_drive(run_id=str(run_id))
        if Run.objects.get(pk=run_id).status != RunStatus.QUEUED:
            return outcome
    raise RuntimeError("the run never finished")


def us(values) -> float:
    return statistics.median(values) * 1e6


def ratio_of_medians(small: list, large: list) -> float:
    return statistics.median(large) / statistics.median(small)


def fitted_ratio(costs: list[float], early: int, late: int) -> float:
    """Cost at pass `late` over cost at pass `early` on the least-squares line through every pass's
    cost (passes over five times the median left out: a pause of the machine, not the engine). The
    line uses all the passes, so the machine's drift weighs on it less than on two short stretches."""
    typical = statistics.median(costs)
    points = [(i, c) for i, c in enumerate(costs) if c <= 5 * typical]
    fit = statistics.linear_regression([i for i, _ in points], [c for _, c in points])
    return (fit.intercept + fit.slope * late) / (fit.intercept + fit.slope * early)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noops", type=int, default=250)
    parser.add_argument("--long-runs", type=int, default=3)
    parser.add_argument("--history", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=12, help="interleaved rounds of one small- and one large-history run")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    import engine_step

    engine_step.BENCH_DB = "warden_bench_flat"
    url = engine_step.bench_database_url()
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("WARDEN_DEMO", "1")
    os.environ["WARDEN_LOG_LEVEL"] = "WARNING"
    os.environ["WARDEN_SCRIPTED_DELAY_SECONDS"] = "0"
    steps = 2 * args.noops + 1
    # Budgets large enough for the long run; the default context window (8,000 tokens) holds it.
    os.environ["WARDEN_MAX_MODEL_CALLS"] = str(steps + 10)
    os.environ["WARDEN_MODEL_CALLS_CAP"] = str(steps + 10)
    os.environ["WARDEN_MAX_TOKENS"] = os.environ["WARDEN_TOKENS_CAP"] = str(10**9)
    os.environ["WARDEN_SLICE_SECONDS"] = "3600"
    import django
    from django.conf import settings

    django.setup()
    settings.CHANNEL_LAYERS = {}
    from channels import layers

    layers.channel_layers.backends.clear()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection, transaction

    from engine.actions.messages import message_post
    from sessions_app.models import Message, MessageRole
    from sessions_app.services import messages_append
    from engine.actions.sessions import session_open

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create(username="bench")
    meter = Meter()
    instrument(meter)

    def post(session, text):
        return message_post(session=session, content=text, acting_user=user, provider_options={"delay": 0}).run

    # Warm-up: prepared statements, caches.
    drive_to_end(post(session_open(owner=user, title="warm-up"), "please run noop 5").id)

    long_ratios = {"wall": [], "cpu": []}
    early_late = {"early_wall": [], "late_wall": [], "early_cpu": [], "late_cpu": []}
    for _ in range(args.long_runs):
        meter.passes.clear()
        outcome = drive_to_end(post(session_open(owner=user, title="long"), f"please run noop {args.noops}").id)
        passes = list(meter.passes)
        assert outcome == "completed" and len(passes) >= steps, (outcome, len(passes))
        ordinary = passes[1:-1]  # the first pass opens the run's first step, the last gives the final answer
        span = min(50, len(ordinary) // 2)
        for clock, column in (("wall", 1), ("cpu", 2)):
            costs = [p[column] for p in ordinary]
            long_ratios[clock].append(fitted_ratio(costs, early=5, late=len(passes) - 1))
            early_late[f"early_{clock}"] += costs[:span]
            early_late[f"late_{clock}"] += costs[-span:]

    def history_of(count: int):
        session = session_open(owner=user, title=f"history {count}")
        chat = [("user", "what is the weather in Paris"), ("assistant", "It is sunny in Paris, 21 °C.")]
        for start in range(0, count, 1000):
            with transaction.atomic():
                messages_append(session_id=session.pk, messages=[
                    Message(role=MessageRole(chat[i % 2][0]), content=f"{chat[i % 2][1]} ({i})")
                    for i in range(start, min(count, start + 1000))
                ])
        drive_to_end(post(session, "please run noop 5").id)  # the first may summarize the history once
        return session

    sizes = (10, args.history)
    sessions = {count: [history_of(count) for _ in range(args.rounds)] for count in sizes}
    passes = {count: [] for count in sizes}
    measured_runs = {count: [] for count in sizes}
    for round_no in range(args.rounds):
        for count in (sizes if round_no % 2 == 0 else sizes[::-1]):
            meter.passes.clear()
            run = post(sessions[count][round_no], "please run noop 5")
            assert drive_to_end(run.id) == "completed"
            passes[count] += [p for p in meter.passes if p[0] == "model"]
            measured_runs[count].append(run.id)

    def manifest_bytes(run_ids) -> float:
        with connection.cursor() as cursor:
            cursor.execute('SELECT avg(pg_column_size("context_manifest")) FROM "runs_app_step" '
                           'WHERE "run_id" = ANY(%s) AND "kind" = %s', [list(run_ids), "model"])
            return float(cursor.fetchone()[0])

    small, large = passes[sizes[0]], passes[sizes[1]]
    result = {
        "long_run_steps": steps, "long_runs": args.long_runs,
        "step_early_us": us(early_late["early_wall"]), "step_late_us": us(early_late["late_wall"]),
        "step_early_cpu_us": us(early_late["early_cpu"]), "step_late_cpu_us": us(early_late["late_cpu"]),
        "long_run_ratio": statistics.median(long_ratios["wall"]), "long_run_ratio_basis": "fitted line, step 2N vs step 5",
        "long_run_ratio_cpu": statistics.median(long_ratios["cpu"]),
        "history_small": sizes[0], "history_large": sizes[1], "history_rounds": args.rounds,
        "model_step_small_history_us": us([p[1] for p in small]),
        "model_step_large_history_us": us([p[1] for p in large]),
        "model_step_small_history_cpu_us": us([p[2] for p in small]),
        "model_step_large_history_cpu_us": us([p[2] for p in large]),
        "history_ratio": ratio_of_medians([p[1] for p in small], [p[1] for p in large]),
        "history_ratio_cpu": ratio_of_medians([p[2] for p in small], [p[2] for p in large]),
        "model_step_statements_small": statistics.mean(p[3] for p in small),
        "model_step_statements_large": statistics.mean(p[3] for p in large),
        "manifest_bytes_small": manifest_bytes(measured_runs[sizes[0]]),
        "manifest_bytes_large": manifest_bytes(measured_runs[sizes[1]]),
        "model_steps_measured": [len(small), len(large)],
    }
    print(json.dumps(result, indent=2))
    print(
        "\n| figure | small | large | ratio wall (goal ≤ 1.2) | ratio CPU |\n|---|---:|---:|---:|---:|\n"
        f"| engine µs per step: the first vs the last fifty of a {steps}-step run, ratio of step {steps - 1} to step 5 on "
        f"the fitted line ({args.long_runs} runs; wall, CPU) "
        f"| {result['step_early_us']:.0f}, {result['step_early_cpu_us']:.0f} | {result['step_late_us']:.0f}, "
        f"{result['step_late_cpu_us']:.0f} | {result['long_run_ratio']:.2f} | {result['long_run_ratio_cpu']:.2f} |\n"
        f"| engine µs per model step: history of 10 vs {args.history:,} messages ({args.rounds} rounds; wall, CPU) "
        f"| {result['model_step_small_history_us']:.0f}, {result['model_step_small_history_cpu_us']:.0f} "
        f"| {result['model_step_large_history_us']:.0f}, {result['model_step_large_history_cpu_us']:.0f} "
        f"| {result['history_ratio']:.2f} | {result['history_ratio_cpu']:.2f} |\n"
        f"| SQL statements per model step; context manifest bytes | {result['model_step_statements_small']:.2f}; "
        f"{result['manifest_bytes_small']:.0f} | {result['model_step_statements_large']:.2f}; "
        f"{result['manifest_bytes_large']:.0f} | | |"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
