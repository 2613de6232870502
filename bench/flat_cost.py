"""Issue 16 goal 2: the engine's cost per step stays flat as work grows.

Two figures, both the engine's own time per durable step — each pass of the worker loop
(`Driver.advance`) less the time spent inside the model provider's stream and the tool itself,
which are the work, not the engine's bookkeeping:
- one long run: "please run noop N" (2N+1 steps); steps 2–11 against the last ten;
- a model step in a session whose history holds 10,000 messages against one holding 10: a run of
  "please run noop 5" posted into each, all its steps.

Usage: python bench/flat_cost.py [--noops 250] [--history 10000] [--json PATH]
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


class Meter:
    """Per pass of the worker loop: its duration, less the time inside the provider and the tool."""

    def __init__(self):
        self.outside = 0.0
        self.passes: list[tuple[str, float]] = []  # (kind of the step the pass advanced, engine seconds)


def instrument(meter: Meter):
    import engine.loop as loop
    import engine.model_step as model_step
    from tools_app import registry

    advance = loop.Driver.advance

    def timed_advance(self, cp):
        meter.outside = 0.0
        kind = "tools" if cp.open_tool_calls else "model"
        started = time.perf_counter()
        try:
            return advance(self, cp)
        finally:
            meter.passes.append((kind, time.perf_counter() - started - meter.outside))

    loop.Driver.advance = timed_advance

    real_get_provider = model_step.get_provider

    class TimedProvider:
        def __init__(self, provider):
            self._provider = provider

        def __getattr__(self, name):
            return getattr(self._provider, name)

        def stream(self, request):
            started = time.perf_counter()
            events = iter(self._provider.stream(request))
            meter.outside += time.perf_counter() - started
            while True:
                started = time.perf_counter()
                try:
                    event = next(events)
                except StopIteration:
                    meter.outside += time.perf_counter() - started
                    return
                meter.outside += time.perf_counter() - started
                yield event

    model_step.get_provider = lambda name: TimedProvider(real_get_provider(name))
    tool = registry.tool_get("noop")

    def timed_noop(ctx, args):
        started = time.perf_counter()
        try:
            return tool.execute(ctx, args)
        finally:
            meter.outside += time.perf_counter() - started

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noops", type=int, default=250)
    parser.add_argument("--history", type=int, default=10_000)
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
    from django.db import transaction

    from engine.actions.messages import message_post
    from sessions_app.models import Message, MessageRole
    from sessions_app.services import messages_append, session_create

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create(username="bench")
    meter = Meter()
    instrument(meter)

    def post(session, text):
        return message_post(session=session, content=text, acting_user=user, provider_options={"delay": 0}).run

    # Warm-up: prepared statements, caches.
    drive_to_end(post(session_create(owner=user, title="warm-up"), "please run noop 5").id)

    meter.passes.clear()
    outcome = drive_to_end(post(session_create(owner=user, title="long"), f"please run noop {args.noops}").id)
    long_run = [seconds for _, seconds in meter.passes]
    assert outcome == "completed" and len(long_run) >= steps, (outcome, len(long_run))
    early, late = long_run[1:11], long_run[-11:-1]  # the final answer's pass is no ordinary step

    def history_of(count: int):
        session = session_create(owner=user, title=f"history {count}")
        chat = [("user", "what is the weather in Paris"), ("assistant", "It is sunny in Paris, 21 °C.")]
        for start in range(0, count, 1000):
            with transaction.atomic():
                messages_append(session_id=session.pk, messages=[
                    Message(role=MessageRole(chat[i % 2][0]), content=f"{chat[i % 2][1]} ({i})")
                    for i in range(start, min(count, start + 1000))
                ])
        return session

    figures = {}
    for count in (10, args.history):
        session = history_of(count)
        drive_to_end(post(session, "please run noop 5").id)  # the first may summarize the history once
        meter.passes.clear()
        outcome = drive_to_end(post(session, "please run noop 5").id)
        assert outcome == "completed", outcome
        figures[count] = [seconds for kind, seconds in meter.passes if kind == "model"]

    result = {
        "long_run_steps": steps,
        "step_early_us": us(early), "step_late_us": us(late), "long_run_ratio": us(late) / us(early),
        "history_small": 10, "history_large": args.history,
        "model_step_small_history_us": us(figures[10]), "model_step_large_history_us": us(figures[args.history]),
        "history_ratio": us(figures[args.history]) / us(figures[10]),
    }
    print(json.dumps(result, indent=2))
    print(
        "\n| figure | small | large | ratio (goal ≤ 1.2) |\n|---|---:|---:|---:|\n"
        f"| engine µs per step: steps 2–11 vs the last ten of a {steps}-step run | {result['step_early_us']:.0f} "
        f"| {result['step_late_us']:.0f} | {result['long_run_ratio']:.2f} |\n"
        f"| engine µs per model step: history of 10 vs {args.history:,} messages "
        f"| {result['model_step_small_history_us']:.0f} | {result['model_step_large_history_us']:.0f} "
        f"| {result['history_ratio']:.2f} |"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
