"""`make bench`: Warden's engine, the PostgreSQL floor and the peer systems in one run, one table.

Each round runs, in an order rotated from round to round so that machine drift hits them alike:
one round of bench/engine_step.py (Warden's engine driven in-process, with its own floor round
on its database) and — where the peers harness is present (../shared/bench/peers beside the
repository, or WARDEN_PEERS_DIR; it is on the team's machines, not in a user's clone) — its
floor.py, dbos_bench.py and langgraph_bench.py, with the arguments its run_all.sh passes. The
peers run in a virtualenv of their own, .warden/peers-venv, with their pinned requirements
(installed again only when requirements.txt changes: a stamp keeps its hash). After the rounds:
bench/throughput.py (real worker processes, issue 16's goal 4), and bench/pickup.py and
bench/sse_idle.py where they exist (or their JSON, given by flag). The peers' RESULT lines are
folded by their summarize.py; everything goes into one markdown table on stdout and one JSON
document, .warden/bench/result.json. Progress and each script's failures go to stderr; every
script's output is kept in .warden/bench/logs/.

Columns: µs per durable step, median over the rounds (min–max), on the basis each script states
(`absolute` = wall/steps; `over plain loop` / `over no checkpointer` = wall minus the same work
undurable; `per step` = DBOS's K=10 workflow minus its K=0 one; `wall/steps` = concurrent
throughput inverted); × floor = over the floor's "txn, sync_commit=on" (the peers' floor.py when
present, else engine_step.py's); client CPU µs/step (the benchmark's process, or the worker
cluster's processes for throughput) and × LangGraph's (PostgresSaver, durability=sync); write
transactions and WAL bytes per step, cluster-wide; SQL statements per step where counted.

Usage: python bench/compare.py [--rounds 5] [--runs 100] [--steps 10] [--engine-runs 50]
                               [--throughput-runs 200] [--throughput-workers 1,2,4] [--layer none|configured]
                               [--pickup-json PATH] [--sse-json PATH] [--flat-json PATH] [--throughput-json PATH]
Every flag's default comes from the environment variable named in its help (so `make bench ROUNDS=1`
works). The database: DATABASE_URL's server; without it, the embedded server for Warden alone, or
127.0.0.1:5432 as postgres when the peers run (they reach it through libpq's PG* variables).
"""

import argparse
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / ".warden" / "bench"
LOGS = OUT / "logs"
PEERS_VENV = ROOT / ".warden" / "peers-venv"
# The peers' server when DATABASE_URL is unset (the team's machines: trust auth as postgres).
PEERS_DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/warden"
PEER_SYSTEMS = ("floor", "dbos", "langgraph")


def env_default(name: str, default):
    value = os.environ.get(name)
    return type(default)(value) if value not in (None, "") else default


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--rounds", type=int, default=env_default("ROUNDS", 5), help="interleaved rounds (ROUNDS, 5)")
    add("--runs", type=int, default=env_default("M", 100), help="peers: runs/workflows/invocations per sample (M, 100)")
    add("--steps", type=int, default=env_default("K", 10), help="no-op steps per run, for every system (K, 10)")
    add("--concurrency", type=int, default=env_default("CONCURRENCY", 10), help="peers' threads/connections (CONCURRENCY, 10)")
    add("--engine-runs", type=int, default=env_default("ENGINE_RUNS", 50),
        help="Warden runs per round: 50 runs of 2K+1 steps ~ the peers' 100 x K (ENGINE_RUNS, 50)")
    add("--layer", choices=["none", "configured"], default=env_default("WARDEN_BENCH_LAYER", "none"),
        help="Warden's live publishing: off, like the peers, or through the configured layer (WARDEN_BENCH_LAYER, none)")
    add("--throughput-runs", type=int, default=env_default("TP_RUNS", 200),
        help="runs started at once by bench/throughput.py; 0 skips it (TP_RUNS, 200)")
    add("--throughput-workers", default=env_default("TP_WORKERS", "1,2,4"), help="worker process counts (TP_WORKERS, 1,2,4)")
    add("--throughput-json", type=Path, help="bench/throughput.py's JSON of an earlier run instead of running it")
    add("--pickup-json", type=Path, help="bench/pickup.py's JSON instead of running it")
    add("--sse-json", type=Path, help="bench/sse_idle.py's JSON instead of running it")
    add("--flat-json", type=Path, help="bench/flat_cost.py's JSON instead of running it")
    add("--others", choices=["run", "skip"], default=env_default("BENCH_OTHERS", "run"),
        help="run bench/pickup.py and bench/sse_idle.py where they exist, or skip them (BENCH_OTHERS, run)")
    add("--deadline", type=float, default=env_default("DEADLINE_S", 900.0), help="no new round after this many seconds (DEADLINE_S, 900)")
    add("--step-timeout", type=float, default=env_default("STEP_TIMEOUT_S", 300.0),
        help="seconds one script of a round may take (STEP_TIMEOUT_S, 300)")
    return parser.parse_args()


# --- running things ------------------------------------------------------------------------------------


def run_child(argv: list, *, log_name: str, timeout: float, cwd: Path = ROOT, env: dict | None = None) -> tuple[int | None, str]:
    """Run one script in a process group of its own, its output in LOGS. A timeout or Ctrl-C
    sends the group SIGTERM first, so that a script that starts processes (throughput.py's
    worker cluster) stops them, then SIGKILL. Returns (exit code or None on timeout, stdout)."""
    out_path, err_path = LOGS / f"{log_name}.out", LOGS / f"{log_name}.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        child = subprocess.Popen([str(a) for a in argv], cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True)
        try:
            code = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            group_stop(child)
            code = None
        except BaseException:
            group_stop(child)
            raise
    return code, out_path.read_text(errors="replace")


def group_stop(child: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(child.pid, sig)
            child.wait(timeout=grace)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def stderr_tail(log_name: str, lines: int = 15) -> str:
    return "\n".join((LOGS / f"{log_name}.err").read_text(errors="replace").splitlines()[-lines:])


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the peers -------------------------------------------------------------------------------------------


def peers_dir() -> Path | None:
    # WARDEN_PEERS_DIR: the peers harness; default ../shared/bench/peers beside the repository.
    path = Path(os.environ.get("WARDEN_PEERS_DIR") or ROOT.parent / "shared" / "bench" / "peers")
    return path if (path / "run_all.sh").is_file() else None


def peers_python(peers: Path) -> Path:
    """.warden/peers-venv with the peers' pinned requirements, reinstalled only when they change."""
    requirements = peers / "requirements.txt"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    python, stamp = PEERS_VENV / "bin" / "python", PEERS_VENV / ".requirements-sha256"
    if not python.exists():
        say(f"creating {PEERS_VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    if not stamp.exists() or stamp.read_text().strip() != digest:
        say(f"installing {requirements} into {PEERS_VENV}")
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-r", str(requirements)], check=True)
        stamp.write_text(digest + "\n")
    return python


def libpq_env(database_url: str) -> dict:
    """PGHOST/PGPORT/PGUSER/PGPASSWORD for the same server (a socket folder may be the host,
    percent-encoded, as the embedded server's URL has it)."""
    parts = urlsplit(database_url)
    auth, _, hostport = parts.netloc.rpartition("@")
    user, _, password = auth.partition(":")
    host = unquote(hostport)
    port = ""
    if not host.startswith("/") and ":" in host.rsplit("]", 1)[-1]:
        host, _, port = host.rpartition(":")
    env = {"PGHOST": host.strip("[]") or "127.0.0.1"}
    if port:
        env["PGPORT"] = port
    if user:
        env["PGUSER"] = unquote(user)
    if password:
        env["PGPASSWORD"] = unquote(password)
    return env


def peer_command(system: str, args) -> list:
    m, k, c = args.runs, args.steps, args.concurrency
    return {  # as run_all.sh passes them
        "floor": ["floor.py", "--runs", m, "--steps-per-run", k, "--concurrency", c],
        "dbos": ["dbos_bench.py", "--workflows", m, "--steps", k, "--concurrency", c],
        "langgraph": ["langgraph_bench.py", "--invocations", m, "--steps", k],
    }[system]


def peer_rows(summary: dict | None, args) -> dict:
    """The peers' folded rows this table shows, by name."""
    if not summary:
        return {}
    rows = {(r["system"], r["mode"]): r for r in summary["results"]}
    wanted = {
        "floor_txn": ("floor", "txn, sync_commit=on"),
        "floor_autocommit": ("floor", "autocommit, sync_commit=on"),
        "langgraph_sync": ("langgraph", "PostgresSaver durability=sync"),
        "dbos_marginal": ("dbos", f"marginal step (K={args.steps} minus K=0)"),
        "dbos_threads": ("dbos", f"workflow K={args.steps}, {args.concurrency} threads"),
    }
    return {name: rows[key] for name, key in wanted.items() if key in rows}


# --- Warden's other figures --------------------------------------------------------------------------


def figures_from(name: str, script: Path, given: Path | None, argv: list, env: dict, timeout: float) -> dict | None:
    """A bench script's JSON: the file given, else the script's own run (`--json PATH`), else
    None when the script does not exist. A failure is recorded, not raised."""
    if given:
        try:
            return json.loads(given.read_text())
        except (OSError, ValueError) as error:
            return {"error": f"unreadable ({error.__class__.__name__})", "log": str(given)}
    if not script.exists():
        return None
    target = OUT / f"{name}.json"
    target.unlink(missing_ok=True)
    say(f"{script.relative_to(ROOT)}: running")
    started = time.monotonic()
    code, _ = run_child([sys.executable, script, *argv, "--json", target], log_name=name, env=env, timeout=timeout)
    if code == 0 and target.exists():
        say(f"{script.relative_to(ROOT)}: ok ({time.monotonic() - started:.0f}s)")
        return json.loads(target.read_text())
    say(f"{script.relative_to(ROOT)}: FAILED ({'timeout' if code is None else f'exit {code}'}), stderr tail:\n{stderr_tail(name)}")
    return {"error": "timeout" if code is None else f"exit {code}", "log": str(LOGS / f"{name}.err")}


# --- the table -----------------------------------------------------------------------------------------


def engine_summary(rounds: list[dict]) -> dict | None:
    if not rounds:
        return None

    def fold(part: str) -> dict:
        keys = rounds[0][part].keys()
        values = {key: [r[part][key] for r in rounds] for key in keys}
        folded = {key: statistics.median(v) for key, v in values.items()}
        folded["us_min"], folded["us_max"] = min(values["us"]), max(values["us"])
        return folded

    return {"rounds": len(rounds), "layer": rounds[0]["layer"], "steps_per_run": rounds[0]["steps_per_run"],
            "runs_per_round": rounds[0]["runs_per_round"], "engine": fold("engine"), "floor": fold("floor")}


def row(label: str, basis: str, us: float | None, us_min=None, us_max=None, steps_per_s=None, cpu=None, txns=None,
        wal=None, statements=None, note: str = "") -> dict:
    return {"figure": label, "basis": basis, "us_per_step": us, "us_min": us_min, "us_max": us_max,
            "steps_per_s": steps_per_s, "cpu_us_per_step": cpu, "write_txns_per_step": txns,
            "wal_bytes_per_step": wal, "sql_statements_per_step": statements, "note": note}


def peer_row(label: str, r: dict, note: str = "") -> dict:
    return row(label, r["basis"], r["per_step_us_median"], r["per_step_us_min"], r["per_step_us_max"],
               r["steps_per_s_median"], r["cpu_us_per_step_median"], r["write_txns_per_step_median"],
               r["wal_bytes_per_step_median"], note=note or plural(r["samples"], "sample"))


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def numbers_note(figures: dict, limit: int = 6) -> str:
    """Another script's JSON in a few words for its row's note: latency groups first
    (`message_post p50 21.4 / p99 40.2 ms, n 200`), then top-level numbers."""
    if "error" in figures:
        return f"failed ({figures['error']}): {figures.get('log', '')}"

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    def latencies(name: str, group: dict) -> str | None:
        ms = [f"{key[:-3]} {value:,.1f}" for key, value in group.items() if key.endswith("_ms") and number(value)]
        if not ms:
            return None
        count = f", n {group['n']}" if number(group.get("n")) else ""
        return f"{name} {' / '.join(ms)} ms{count}".strip()

    groups = [latencies(key, value) for key, value in figures.items() if isinstance(value, dict)]
    found = [g for g in [latencies("", figures), *groups] if g]
    found += [f"{key} {value:,.4g}" for key, value in figures.items() if number(value) and not key.endswith("_ms")]
    return "; ".join(found[:limit]) or "(no numbers at its top level; see result.json)"


def table_rows(peers: dict, engine: dict | None, throughput: dict | None, others: dict, args) -> list[dict]:
    rows = []
    if "floor_txn" in peers:
        rows.append(peer_row("floor: BEGIN; INSERT; COMMIT (txn, sync_commit=on)", peers["floor_txn"]))
    if "floor_autocommit" in peers:
        rows.append(peer_row("floor: INSERT alone (autocommit, sync_commit=on)", peers["floor_autocommit"]))
    if engine:
        f = engine["floor"]
        rows.append(row("floor: txn, sync_commit=on, in warden_bench (engine_step.py)", "absolute", f["us"], f["us_min"],
                        f["us_max"], 1e6 / f["us"], f["cpu_us"], f["xids"], f["wal"], note=plural(engine["rounds"], "round")))
    if "langgraph_sync" in peers:
        rows.append(peer_row("LangGraph PostgresSaver durability=sync", peers["langgraph_sync"]))
    if "dbos_marginal" in peers:
        rows.append(peer_row("DBOS marginal step (K=10 workflow minus K=0)", peers["dbos_marginal"]))
    if "dbos_threads" in peers:
        r = peers["dbos_threads"]
        rows.append(peer_row(f"DBOS workflows from {args.concurrency} threads", r,
                             note=f"{plural(r['samples'], 'sample')}, {r['workflows_per_s_median']:,.1f} workflows/s"))
    if engine:
        e = engine["engine"]
        rows.append(row(f"Warden per step (engine in-process, layer {engine['layer']})", "absolute", e["us"], e["us_min"],
                        e["us_max"], 1e6 / e["us"], e["cpu_us"], e["xids"], e["wal"], e.get("statements"),
                        note=f"{plural(engine['rounds'], 'round')} of {engine['runs_per_round']} runs × {engine['steps_per_run']} steps"))
    for t in (throughput or {}).get("by_workers", []):
        rows.append(row(f"Warden throughput, {t['workers']} worker process{'es' if t['workers'] > 1 else ''}",
                        "wall/steps", t["us_per_step"], steps_per_s=t["steps_per_s"], cpu=t["cluster_cpu_us_per_step"],
                        txns=t["write_txns_per_step"], wal=t["wal_bytes_per_step"],
                        note=f"{t['runs']} runs at once, {t['runs_per_s']:,.1f} runs/s; CPU: workers "
                             f"{fmt(t['worker_cpu_us_per_step'])} + rest of cluster {fmt(t['cluster_other_cpu_us_per_step'])}"
                             f"; PostgreSQL server {fmt(t['server_cpu_us_per_step'])} µs/step"))
    if throughput and "error" in throughput:
        rows.append(row("Warden throughput (bench/throughput.py)", "-", None, note=numbers_note(throughput)))
    for label, figures in others.items():
        if figures is not None:
            rows.append(row(label, "-", None, note=numbers_note(figures)))
    return rows


def fmt(x, nd: int = 0) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def ratio(x, ref) -> str:
    return "-" if x is None or not ref else f"{x / ref:,.2f}×"


def markdown(rows: list[dict], floor: dict | None, langgraph_cpu: float | None) -> str:
    head = ["figure", "basis", "µs/step median", "min–max", "× floor", "steps/s", "client CPU µs/step", "× LangGraph CPU",
            "write txns/step", "WAL B/step", "× floor WAL", "SQL stmts/step", "note"]
    dropped = {head.index("× LangGraph CPU")} if langgraph_cpu is None else set()
    floor_us = floor["us_per_step"] if floor else None
    floor_wal = floor["wal_bytes_per_step"] if floor else None
    body = []
    for r in rows:
        spread = f"{fmt(r['us_min'])}–{fmt(r['us_max'])}" if r["us_min"] is not None else "-"
        body.append([r["figure"], r["basis"], fmt(r["us_per_step"]), spread, ratio(r["us_per_step"], floor_us),
                     fmt(r["steps_per_s"]), fmt(r["cpu_us_per_step"]), ratio(r["cpu_us_per_step"], langgraph_cpu),
                     fmt(r["write_txns_per_step"], 2), fmt(r["wal_bytes_per_step"]), ratio(r["wal_bytes_per_step"], floor_wal),
                     fmt(r["sql_statements_per_step"], 1), r["note"]])
    kept = [i for i in range(len(head)) if i not in dropped]
    head, body = [head[i] for i in kept], [[cells[i] for i in kept] for cells in body]
    left = {0, 1, len(head) - 1}
    widths = [max(len(str(cell)) for cell in column) for column in zip(head, *body)]

    def line(cells):
        return "| " + " | ".join(str(c).ljust(w) if i in left else str(c).rjust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    rule = "|" + "|".join("-" * (w + 2) if i in left else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|"
    return "\n".join([line(head), rule, *(line(b) for b in body)])


def goal_four(peers: dict, throughput: dict | None) -> dict | None:
    """Issue 16, goal 4: with the default two workers, at least DBOS's 10-thread steps/s."""
    by_workers = {t["workers"]: t for t in (throughput or {}).get("by_workers", [])}
    if 2 not in by_workers or "dbos_threads" not in peers:
        return None
    warden, dbos = by_workers[2], peers["dbos_threads"]
    return {"warden_2_workers_steps_per_s": warden["steps_per_s"], "warden_2_workers_runs_per_s": warden["runs_per_s"],
            "dbos_threads_steps_per_s": dbos["steps_per_s_median"],
            "dbos_threads_workflows_per_s": dbos["workflows_per_s_median"],
            "met": warden["steps_per_s"] >= dbos["steps_per_s_median"],
            "steps_per_s_by_workers": {w: t["steps_per_s"] for w, t in sorted(by_workers.items())},
            "runs": warden["runs"], "steps_per_run": warden["steps_per_run"]}


# --- the run ---------------------------------------------------------------------------------------------


class Peers:
    """The peers harness and how to run its scripts: its virtualenv, libpq's variables."""

    def __init__(self, directory: Path, env: dict, database_url: str):
        self.directory = directory
        self.python = peers_python(directory)
        self.env = {**env, **libpq_env(database_url), "PYTHONDONTWRITEBYTECODE": "1"}

    def run(self, argv: list, *, log_name: str, timeout: float) -> tuple[int | None, str]:
        return run_child([self.python, *argv], log_name=log_name, cwd=self.directory, env=self.env, timeout=timeout)

    def reset(self) -> None:
        if self.run(["_common.py", "--reset"], log_name="peers-reset", timeout=120)[0] != 0:
            raise SystemExit(f"the peers' databases could not be re-created:\n{stderr_tail('peers-reset')}")

    def summarize(self, raw: list[str], meta: list[str]) -> dict | None:
        raw_path, summary_path = OUT / "peers-raw.jsonl", OUT / "peers.json"
        raw_path.write_text("\n".join(raw) + "\n")
        code, _ = self.run(["summarize.py", raw_path, summary_path, *[x for m in meta for x in ("--meta", m)]],
                           log_name="peers-summarize", timeout=120)
        if code != 0:
            say(f"summarize.py FAILED:\n{stderr_tail('peers-summarize')}")
            return None
        return json.loads(summary_path.read_text())


def rounds_run(args, peers: Peers | None, env: dict) -> dict:
    """The interleaved rounds: every system once per round, the order rotated each round."""
    systems = [*PEER_SYSTEMS, "warden"] if peers else ["warden"]
    raw, engine_rounds, orders, failures = [], [], [], []
    started = time.monotonic()
    for round_no in range(args.rounds):
        if time.monotonic() - started > args.deadline:
            say(f"deadline ({args.deadline:.0f}s) reached: stopping after {round_no} rounds")
            break
        orders.append([systems[(i + round_no) % len(systems)] for i in range(len(systems))])
        for system in orders[-1]:
            name, t0 = f"round{round_no}-{system}", time.monotonic()
            if system == "warden":
                target = OUT / f"engine-round{round_no}.json"
                target.unlink(missing_ok=True)
                code, _ = run_child([sys.executable, ROOT / "bench" / "engine_step.py", "--rounds", 1,
                                     "--runs", args.engine_runs, "--noops", args.steps, "--layer", args.layer,
                                     "--json", target], log_name=name, env=env, timeout=args.step_timeout)
                if code == 0:
                    engine_rounds.append(json.loads(target.read_text()))
            else:
                code, out = peers.run([*peer_command(system, args), "--round", round_no], log_name=name,
                                      timeout=args.step_timeout)
                raw += [line[len("RESULT "):] for line in out.splitlines() if line.startswith("RESULT ")]
            if code == 0:
                say(f"round {round_no + 1}/{args.rounds}: {system} ok ({time.monotonic() - t0:.0f}s)")
            else:
                failures.append(name)
                say(f"round {round_no + 1}/{args.rounds}: {system} FAILED "
                    f"({'timeout' if code is None else f'exit {code}'}), stderr tail:\n{stderr_tail(name)}")
    return {"raw": raw, "engine_rounds": engine_rounds, "orders": orders, "failures": failures,
            "elapsed_s": time.monotonic() - started}


OTHER_SCRIPTS = {  # result key: (row label, script, the flag that gives its JSON instead)
    "pickup": ("Warden pickup latency (bench/pickup.py)", "pickup.py", "pickup_json"),
    "sse_idle": ("Warden idle SSE streams (bench/sse_idle.py)", "sse_idle.py", "sse_json"),
    "flat_cost": ("Warden cost as work grows (bench/flat_cost.py)", "flat_cost.py", "flat_json"),
}


def others_run(args, env: dict) -> dict:
    """bench/throughput.py (unless skipped), and the other Warden scripts where they exist."""
    figures = {"throughput": None}
    if args.throughput_json or args.throughput_runs > 0:
        figures["throughput"] = figures_from(
            "throughput", ROOT / "bench" / "throughput.py", args.throughput_json,
            ["--runs", args.throughput_runs, "--noops", args.steps, "--workers", args.throughput_workers,
             "--layer", args.layer], env, timeout=3600)
    for key, (_, script, flag) in OTHER_SCRIPTS.items():
        given = getattr(args, flag)
        run = given or args.others == "run"
        figures[key] = figures_from(key, ROOT / "bench" / script, given, [], env, 1800) if run else None
    return figures


def report(args, *, peers_found: bool, rounds: dict, summary: dict | None, figures: dict,
           elapsed_s: float) -> tuple[str, dict]:
    """The table and the lines under it; and the part of the JSON document they are made of."""
    chosen = peer_rows(summary, args)
    engine = engine_summary(rounds["engine_rounds"])
    others = {label: figures[key] for key, (label, _, _) in OTHER_SCRIPTS.items()}
    rows = table_rows(chosen, engine, figures["throughput"], others, args)
    peers_floor = next((r for r in rows if r["figure"].startswith("floor: BEGIN")), None)
    floor = peers_floor or next((r for r in rows if r["figure"].startswith("floor: txn")), None)
    langgraph_cpu = chosen["langgraph_sync"]["cpu_us_per_step_median"] if "langgraph_sync" in chosen else None
    table = markdown(rows, floor, langgraph_cpu)
    goal = goal_four(chosen, figures["throughput"])

    lines = [] if peers_found else ["Peers harness not found: Warden's engine and its own floor only.\n"]
    lines.append(table + "\n")
    if floor:
        lines.append(f"× floor, × floor WAL: over \"{floor['figure']}\".")
    if engine and peers_floor:
        lines.append(f"Warden per step over its own floor round (engine_step.py, same database): "
                     f"{engine['engine']['us'] / engine['floor']['us']:,.2f}×.")
    if goal:
        steps = ", ".join(f"{w}: {s:,.0f}" for w, s in goal["steps_per_s_by_workers"].items())
        lines.append(
            f"Goal 4 (issue 16): {goal['runs']} runs × {goal['steps_per_run']} steps at once, 2 workers: "
            f"{goal['warden_2_workers_steps_per_s']:,.0f} steps/s ({goal['warden_2_workers_runs_per_s']:,.1f} runs/s) vs DBOS "
            f"{args.concurrency} threads {goal['dbos_threads_steps_per_s']:,.0f} steps/s "
            f"({goal['dbos_threads_workflows_per_s']:,.1f} workflows/s of {args.steps} steps): "
            f"{'met' if goal['met'] else 'NOT met'}. Steps/s by workers: {steps}.")
    if rounds["failures"]:
        lines.append(f"Failed (left out of the medians): {', '.join(rounds['failures'])}; logs in {LOGS}.")
    if summary:
        machine = summary["environment"]
        lines.append(f"{machine['postgres'].split(' on ')[0]} | {machine['cpus']} CPUs ({machine['cpu_model']}) | "
                     f"peers: Python {machine['python']}, "
                     + ", ".join(f"{k} {v}" for k, v in machine["packages"].items() if v))
    lines.append(f"{plural(len(rounds['orders']), 'round')} in {rounds['elapsed_s']:.0f}s, {elapsed_s:.0f}s in all; "
                 f"JSON: {OUT / 'result.json'}")
    document = {"warden_engine": {"summary": engine, "rounds": rounds["engine_rounds"]}, "goal_4": goal, "rows": rows,
                "reference_floor": floor["figure"] if floor else None, "table": table}
    return "\n".join(lines), document


def main() -> None:
    args = arguments()
    started = time.monotonic()
    LOGS.mkdir(parents=True, exist_ok=True)
    directory = peers_dir()
    database_url = os.environ.get("DATABASE_URL") or (PEERS_DEFAULT_URL if directory else None)
    env = {**os.environ, "WARDEN_DEMO": "1", "PYTHONUNBUFFERED": "1"}
    if database_url:
        env["DATABASE_URL"] = database_url
    peers = Peers(directory, env, database_url) if directory else None
    if peers:
        peers.reset()
    else:
        say("peers harness not found (../shared/bench/peers or WARDEN_PEERS_DIR): Warden's engine and its floor only")

    rounds = rounds_run(args, peers, env)
    figures = others_run(args, env)
    meta = [f"rounds={len(rounds['orders'])}", f"M={args.runs}", f"K={args.steps}", f"concurrency={args.concurrency}",
            f"elapsed_s={rounds['elapsed_s']:.0f}"]
    summary = peers.summarize(rounds["raw"], meta) if peers and rounds["raw"] else None
    text, document = report(args, peers_found=peers is not None, rounds=rounds, summary=summary, figures=figures,
                            elapsed_s=time.monotonic() - started)

    server = urlsplit(database_url).netloc.rpartition("@")[2] if database_url else "embedded"
    result = {
        "generated_at": datetime.now(timezone.utc).isoformat(),
        "config": {"rounds": args.rounds, "runs": args.runs, "steps": args.steps, "concurrency": args.concurrency,
                   "engine_runs": args.engine_runs, "layer": args.layer, "throughput_runs": args.throughput_runs,
                   "throughput_workers": args.throughput_workers, "server": unquote(server)},
        "peers_dir": str(directory) if directory else None,
        "rounds_done": len(rounds["orders"]), "orders": rounds["orders"], "failures": rounds["failures"],
        "rounds_elapsed_s": rounds["elapsed_s"], "elapsed_s": time.monotonic() - started,
        "peers": summary,
        **figures,
        **document,
    }
    (OUT / "result.json").write_text(json.dumps(result, indent=2, default=str))
    print(text)


if __name__ == "__main__":
    main()
