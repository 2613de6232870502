"""Issue 15's overhead budget: the engine step with telemetry on (tracing exported through the
batch processor, JSON logs, a /metrics scrape per round) against the same with it off, <= 5 %.

Telemetry cannot be switched off again inside one process (OpenTelemetry's provider and the
psycopg instrumentation are process-wide), so this alternates whole runs of bench/engine_step.py
— off, on, on with SQL statement spans, off, … — each with its own floor measured beside it, and compares the medians of
engine time per step, of engine time over the floor (which cancels the machine's drift between
runs), and of the engine's client CPU per step.

Usage: python bench/telemetry_overhead.py [--pairs 3] [--runs 20] [--rounds 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


CONFIGS = {"off": ("off", {}), "on": ("on", {"WARDEN_TRACE_SQL": "0"}), "on + SQL spans": ("on", {"WARDEN_TRACE_SQL": "1"})}


def one(config: str, runs: int, rounds: int) -> dict:
    telemetry, env = CONFIGS[config]
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "engine_step.py"), "--layer", "none", "--telemetry", telemetry,
         "--runs", str(runs), "--rounds", str(rounds)],
        cwd=ROOT, capture_output=True, text=True, check=True, env={**os.environ, **env},
    ).stdout
    return json.loads(out[: out.rindex("}") + 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = {config: [] for config in CONFIGS}
    for pair in range(args.pairs):
        for telemetry in CONFIGS:
            result = one(telemetry, args.runs, args.rounds)
            results[telemetry].append(result)
            print(f"pair {pair + 1} telemetry {telemetry}: engine {result['engine']['us']:.0f} µs/step, "
                  f"floor {result['floor']['us']:.0f}, ratio {result['ratio']:.2f}, cpu {result['engine']['cpu_us']:.0f}",
                  file=sys.stderr)

    def med(telemetry, pick):
        return statistics.median(pick(r) for r in results[telemetry])

    rows = [
        ("engine µs/step", lambda r: r["engine"]["us"]),
        ("engine ÷ floor", lambda r: r["ratio"]),
        ("engine client CPU µs/step", lambda r: r["engine"]["cpu_us"]),
        ("SQL statements/step", lambda r: r["engine"]["statements"]),
    ]
    print(f"\n{args.pairs} alternating pairs, {args.rounds} rounds of {args.runs} runs each, medians\n")
    print("| figure | telemetry off | on (default) | overhead | on + SQL spans (WARDEN_TRACE_SQL) | overhead |\n"
          "|---|---:|---:|---:|---:|---:|")
    for name, pick in rows:
        off, on, sql = med("off", pick), med("on", pick), med("on + SQL spans", pick)
        print(f"| {name} | {off:,.2f} | {on:,.2f} | {(on / off - 1) * 100:+.1f} % | {sql:,.2f} | {(sql / off - 1) * 100:+.1f} % |")


if __name__ == "__main__":
    main()
