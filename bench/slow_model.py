"""`make bench-concurrent` (issue 34): Warden on the peers' slow-model workload, beside the
plain-asyncio ceiling, LangGraph and DBOS in the same run.

The workload is ../shared/bench/peers/run_concurrent.sh's: its OpenAI-compatible model server
(llm_server.py) answers each streamed call after a fixed latency L; each of N conversations makes
K tool-call turns (a read tool between model calls) and a final answer. The ideal is N / L model
calls a second. Warden runs as `make run` would, through a real django-q2 cluster
(warden_concurrent.py), each worker process driving many runs at once (WARDEN_RUNS_PER_WORKER).

Two sizes, as the issue's acceptance states them (each overridable):
    small  N=100,  L=1 s, K=3, 2 worker processes (make run's default settings)
    large  N=1000, L=2 s, K=5, 4 worker processes, 300 runs and 6 pooled connections each, the
           cluster taking 8 tasks from the queue at a claim
One table on stdout per size: achieved vs ideal model calls/s, p50/p99 run duration against the
ideal (K+1)·L, the workers' RSS in total and per in-flight run, PostgreSQL connections, CPU per
model call. The raw JSON goes to .warden/bench/concurrent-<size>.json.

Without ../shared/bench/peers there is no model server to measure against: it says so and stops.
The harness is read-only and was written against an older Warden: it runs from a copy
(.warden/peers-harness) whose warden_concurrent.py gets the changes listed in HARNESS_CHANGES —
where Warden's models live now, and the runs in flight (workers × runs per worker) as its
concurrency — each checked to apply, so a changed harness stops the bench instead of measuring
something else.

    .venv/bin/python bench/slow_model.py [--sizes small,large] [--systems "plain langgraph dbos"]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import OUT, PEERS_DEFAULT_URL, ROOT, libpq_env, peers_dir, peers_python, say  # noqa: E402

SIZES = {
    "small": {"n": 100, "latency_ms": 1000, "k": 3, "workers": 2, "runs_per_worker": 100, "db_pool": 0, "q_bulk": 0},
    # Six pooled connections a process (WARDEN_WORKER_DB_POOL_SIZE; default 8) keep four processes,
    # with their lease keepers and the cluster's own, within the 40 connections. 300 runs a
    # process, not 250: django-q2's processes take tasks as they come free, and with exactly 1,000
    # slots for 1,000 runs the last few waited for one in a full process. Eight tasks a claim
    # (WARDEN_Q_BULK) start the burst's runs in ~5 s instead of ~7.
    "large": {"n": 1000, "latency_ms": 2000, "k": 5, "workers": 4, "runs_per_worker": 300, "db_pool": 6, "q_bulk": 8},
}


HARNESS = OUT.parent / "peers-harness"
HARNESS_CHANGES = [
    # The floor-plan issue moved agents out of runs_app.
    ("    from runs_app.models import Agent\n", "    from agents.models import Agent\n", 2),
    # Runs in flight at most: each worker process drives WARDEN_RUNS_PER_WORKER of them.
    ("concurrency=workers,", "concurrency=workers * int(os.environ.get('WARDEN_RUNS_PER_WORKER', '1')),", 1),
]


def harness(peers: Path) -> Path:
    """A fresh copy of the peers' harness with HARNESS_CHANGES applied to warden_concurrent.py."""
    shutil.rmtree(HARNESS, ignore_errors=True)
    shutil.copytree(peers, HARNESS)
    script = HARNESS / "warden_concurrent.py"
    script.chmod(0o644)
    text = script.read_text()
    for old, new, count in HARNESS_CHANGES:
        if text.count(old) != count:
            raise SystemExit(f"the peers' warden_concurrent.py changed: expected {count} × {old.strip()!r}")
        text = text.replace(old, new)
    script.write_text(text)
    return HARNESS


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=os.environ.get("SIZES", "small,large"), help="small, large or both")
    parser.add_argument("--systems", default=os.environ.get("SYSTEMS", "plain langgraph dbos"),
                        help="the peers beside Warden (run_concurrent.sh's SYSTEMS)")
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", 1)))
    for name in ("n", "latency_ms", "k", "workers", "runs_per_worker", "db_pool", "q_bulk"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=f"override the sizes' {name}")
    return parser.parse_args()


def run_size(name: str, size: dict, args, peers: Path, python: Path) -> list[dict]:
    OUT.mkdir(parents=True, exist_ok=True)
    result = OUT / f"concurrent-{name}.json"
    env = {
        **os.environ,
        **libpq_env(os.environ.get("DATABASE_URL") or PEERS_DEFAULT_URL),
        "VENV": str(python.parent.parent),
        "NS": str(size["n"]), "LATENCY_MS": str(size["latency_ms"]), "K": str(size["k"]),
        "SYSTEMS": args.systems, "ROUNDS": str(args.rounds),
        "WARDEN_DIR": str(ROOT), "WARDEN_WORKERS": str(size["workers"]),
        "WARDEN_RUNS_PER_WORKER": str(size["runs_per_worker"]),
        **({"WARDEN_WORKER_DB_POOL_SIZE": str(size["db_pool"])} if size["db_pool"] else {}),
        **({"WARDEN_Q_BULK": str(size["q_bulk"])} if size["q_bulk"] else {}),
        # Warden's predicted wall (N(K+1)L / W) assumed one run per process.
        "WARDEN_MAX_PREDICTED_S": "100000",
        "PEERS_CONCURRENT_RESULT": str(result),
    }
    env.pop("WARDEN_DEMO", None)
    say(f"{name}: N={size['n']} L={size['latency_ms']} ms K={size['k']}, Warden {size['workers']} workers × "
        f"{size['runs_per_worker']} runs; peers: {args.systems}")
    subprocess.run(["bash", str(peers / "run_concurrent.sh")], env=env, check=True, cwd=peers)
    return json.loads(result.read_text()).get("results", []) if result.exists() else []


def fmt(value, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def table(name: str, size: dict, rows: list[dict]) -> None:
    ideal = size["n"] / (size["latency_ms"] / 1000)
    ideal_run = (size["k"] + 1) * size["latency_ms"] / 1000
    plain = next((r.get("steps_per_s") for r in rows if r.get("system") == "plain"), None)
    print(f"\n{name}: N={size['n']}, L={size['latency_ms'] / 1000:g} s, K={size['k']}: ideal {ideal:g} model calls/s, "
          f"ideal run {ideal_run:g} s")
    print("| system | done | model calls/s | of ideal | of plain | run p50 / p99 s | RSS MB | MB per run | PG conns | CPU ms/call |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        calls, rss = r.get("steps_per_s"), r.get("rss_peak_mb")
        # Warden's "concurrency" is its runs in flight at most (workers × runs per worker, at most N).
        in_flight = min(size["n"], size["workers"] * size["runs_per_worker"]) if r["system"] == "warden" else size["n"]
        print(f"| {r['system']} ({r['mode']}) | {fmt(r.get('completed'), 0)}/{r['n']} | {fmt(calls)} | "
              f"{fmt(calls / ideal if calls else None, 2)} | {fmt(calls / plain if calls and plain else None, 2)} | "
              f"{fmt(r.get('run_p50_s'), 2)} / {fmt(r.get('run_p99_s'), 2)} | {fmt(rss, 0)} | "
              f"{fmt(rss / in_flight if rss else None, 2)} | {fmt(r.get('pg_conns_peak'), 0)} | {fmt(r.get('cpu_ms_per_step'))} |")


def main() -> None:
    args = arguments()
    peers = peers_dir()
    if peers is None or not (peers / "run_concurrent.sh").is_file():
        say("no ../shared/bench/peers (run_concurrent.sh, llm_server.py): nothing to measure against; "
            "set WARDEN_PEERS_DIR to the peers harness")
        sys.exit(2)
    python = peers_python(peers)
    peers = harness(peers)
    for name in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        size = {key: getattr(args, key) if getattr(args, key) is not None else value for key, value in SIZES[name].items()}
        rows = run_size(name, size, args, peers, python)
        table(name, size, rows)


if __name__ == "__main__":
    main()
