"""Throughput of real worker processes: N runs of K no-op steps started at once (issue 16, goal 4).

Goal: 200 runs of 10 no-op steps, started at once, finish at no fewer steps/s than DBOS's
10-thread figure of the same `make bench` run, on the same cores, with the default two workers,
and scale with workers — reported for 1, 2 and 4 worker processes.

A run is the benchmark conversation "please run noop K" of bench/engine_step.py: a zero-latency
scripted model asks for K no-op read tools one after another, then answers — 2K+1 durable steps
(K+1 model steps, K tool calls), counted as engine_step.py counts them. The workers are a real
django-q2 cluster (`manage.py qcluster` as `bench/throughput.py --serve-workers`, which only
switches the live layer off first when `--layer none`) with WARDEN_WORKERS processes, on the
database warden_bench_tp (re-created and migrated here), in the demo world.

Started at once: this process creates the runs through `message_post`, as the API does, but its
django-q2 tasks go to a queue the cluster does not read (django-q2's `cluster_name`, HELD_QUEUE);
one UPDATE then moves every task to the cluster's queue, and its commit is time zero. The clock
stops at the last run's `finished_at`; the runs are polled every 0.1 s, at most `--timeout` s.
Before that, 2 runs per worker go through the cluster the same way (forking done, imports and
connections warm).

Kept out of the window: the sweeper. Its django-q2 schedule (a migration creates it) fires when
a cluster starts and every minute, and re-enqueues queued runs it finds stale; it is deleted
from this database, and no `sweep --loop` runs. The rest of the cluster is as deployed
(config/settings.py's Q_CLUSTER: ORM broker, poll, save_limit — the monitor saves each task's
result row), so its cost is in the figures.

Measured per worker count, over the window: steps/s and runs/s; CPU per step of the worker
processes and of the rest of the cluster (sentinel, pusher, monitor) — psutil when installed,
/proc otherwise — and of the PostgreSQL server when it runs on this machine (all its
processes: other clients of the server count too); write transactions (xids) and WAL bytes per
step, cluster-wide.

Usage: python bench/throughput.py [--runs 200] [--noops 10] [--workers 1,2,4] [--layer none|configured]
                                  [--timeout 600] [--json PATH]
Needs DATABASE_URL (or the embedded server). Uses (and re-creates) the database warden_bench_tp.
"""

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib import import_module
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BENCH_DB = "warden_bench_tp"
# The queue this process enqueues to; the cluster reads Q_CLUSTER["name"]'s ("warden").
HELD_QUEUE = "warden-bench-held"
LOG_DIR = ROOT / ".warden" / "bench" / "logs"


# --- the worker side (a separate process: `--serve-workers`) ------------------------------------


def serve_workers(layer: str) -> None:
    """`manage.py qcluster`, with the live layer off first when asked, and each worker's pid
    written to WARDEN_BENCH_PID_DIR so that the bench can tell worker CPU from the rest."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django
    from django.conf import settings

    django.setup()
    if layer == "none":
        layers_off(settings)
    from django.core.management import call_command
    from django_q import cluster

    pid_dir = Path(os.environ["WARDEN_BENCH_PID_DIR"])
    product_worker = cluster.worker

    def worker(*args, **kwargs):
        (pid_dir / str(os.getpid())).touch()
        return product_worker(*args, **kwargs)

    cluster.worker = worker  # what the sentinel forks for each worker process
    call_command("qcluster")


def layers_off(settings) -> None:
    settings.CHANNEL_LAYERS = {}
    from channels import layers

    layers.channel_layers.backends.clear()


# --- setting up ------------------------------------------------------------------------------------


def bench_database_url() -> str:
    base = os.environ.get("DATABASE_URL")
    if not base:
        from config.embedded_db import embedded_database_url

        base = embedded_database_url(ROOT)
    parts = urlsplit(base)
    import psycopg

    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    return urlunsplit(parts._replace(path=f"/{BENCH_DB}"))


class Cluster:
    """One `--serve-workers` process in a process group of its own; nothing of it outlives stop()."""

    def __init__(self, workers: int, layer: str, env: dict):
        self.pid_dir = LOG_DIR / f"throughput-pids-{workers}"
        self.pid_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.pid_dir.iterdir():
            stale.unlink()
        log = open(LOG_DIR / f"throughput-cluster-{workers}.log", "wb")
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "throughput.py"), "--serve-workers", "--layer", layer],
            cwd=ROOT, env={**env, "WARDEN_WORKERS": str(workers), "WARDEN_BENCH_PID_DIR": str(self.pid_dir)},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def worker_pids(self) -> set[int]:
        return {int(path.name) for path in self.pid_dir.iterdir()}

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        # SIGTERM to the cluster's own process only, as a supervisor stops it: django-q2 then stops
        # its sentinel, pusher, workers and monitor in order (signalled all at once, they wait on
        # each other). Whatever is left after the grace period goes with the group.
        try:
            self.process.terminate()
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            print("cluster did not stop within 20 s; killing its process group", file=sys.stderr)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


# --- CPU ---------------------------------------------------------------------------------------------


def process_tree_cpu(root_pid: int) -> dict[int, float]:
    """CPU seconds (user + system, plus those of reaped children, so a process that exited
    inside the window still counts through its parent) of root_pid and each descendant."""
    try:
        import psutil
    except ImportError:
        return _proc_tree_cpu(root_pid)
    try:
        root = psutil.Process(root_pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    totals = {}
    for process in family:
        try:
            t = process.cpu_times()
            totals[process.pid] = t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return totals


def _proc_tree_cpu(root_pid: int) -> dict[int, float]:
    ticks = os.sysconf("SC_CLK_TCK")
    parents, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        pid = int(entry)
        parents[pid] = int(fields[1])
        cpu[pid] = sum(int(x) for x in fields[11:15]) / ticks  # utime stime cutime cstime
    family, frontier = {root_pid}, [root_pid]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in family]
        family.update(children)
        frontier.extend(children)
    return {pid: cpu[pid] for pid in family if pid in cpu}


def postmaster_pid(conn) -> int | None:
    """The local PostgreSQL server's postmaster, or None when the server is elsewhere."""
    backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    try:
        with open(f"/proc/{backend}/cmdline", "rb") as f:
            local = b"postgres" in f.read().split(b"\0")[0]  # not a local process that shares the remote pid
        with open(f"/proc/{backend}/stat") as f:
            parent = int(f.read().rpartition(")")[2].split()[1])
    except OSError:
        return None
    return parent if local else None


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> dict[int, float]:
    return {pid: after[pid] - before.get(pid, 0.0) for pid in after}


# --- measuring -----------------------------------------------------------------------------------------


def counters(conn) -> tuple[int, int]:
    row = conn.execute(
        "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
    ).fetchone()
    return int(row[0]), int(row[1])


def runs_create(count: int, noops: int, user) -> list[str]:
    """Queued runs whose tasks wait on HELD_QUEUE (their enqueue follows each post's commit)."""
    from engine.actions.messages import message_post
    from engine.actions.sessions import session_open

    run_ids = []
    for _ in range(count):
        session = session_open(owner=user, title="bench throughput")
        run_ids.append(str(message_post(session=session, content=f"please run noop {noops}", acting_user=user,
                                        provider_options={"delay": 0}).run.id))
    return run_ids


def tasks_release(conn, cluster_queue: str) -> int:
    """Every held task onto the cluster's queue in one transaction, whose commit starts the clock.
    Under a doorbell broker (engine/broker.py) an idle cluster waits for a NOTIFY on its CHANNEL
    rather than polling, so the release rings it as queueing a task does."""
    from django_q.conf import Conf
    from django_q.models import OrmQ

    with conn.transaction():
        moved = conn.execute(f"UPDATE {OrmQ._meta.db_table} SET key = %s WHERE key = %s", (cluster_queue, HELD_QUEUE)).rowcount
        if Conf.BROKER_CLASS and (channel := getattr(import_module(Conf.BROKER_CLASS.rsplit(".", 1)[0]), "CHANNEL", None)):
            conn.execute("SELECT pg_notify(%s, %s)", (channel, cluster_queue))
    return moved


def runs_wait(conn, run_ids: list[str], timeout: float, cluster: Cluster) -> dict:
    """Poll until every run has ended; returns counts and the last finished_at (unix time)."""
    from runs_app.models import TERMINAL_STATUSES, Run, RunStatus

    table = Run._meta.db_table
    deadline = time.monotonic() + timeout
    while True:
        ended, completed, last = conn.execute(
            f"SELECT count(*) FILTER (WHERE status = ANY(%s)), count(*) FILTER (WHERE status = %s),"
            f" extract(epoch FROM max(finished_at)) FROM {table} WHERE id = ANY(%s::uuid[])",
            ([str(s) for s in TERMINAL_STATUSES], str(RunStatus.COMPLETED), run_ids),
        ).fetchone()
        if ended == len(run_ids) or time.monotonic() > deadline or not cluster.alive():
            return {"ended": ended, "completed": completed, "last_finished": float(last) if last else None,
                    "timed_out": ended < len(run_ids)}
        time.sleep(0.1)


def measure(workers: int, args, env: dict, user, monitor) -> dict:
    from django_q.conf import Conf

    from runs_app.models import Step

    cluster_queue = Conf.PREFIX  # the cluster's queue: Q_CLUSTER["name"], no cluster_name of its own
    cluster = Cluster(workers, args.layer, env)
    try:
        warm = runs_create(2 * workers, args.noops, user)
        tasks_release(monitor, cluster_queue)
        warmed = runs_wait(monitor, warm, 120, cluster)
        if warmed["completed"] != len(warm):
            raise SystemExit(f"workers={workers}: warm-up runs did not complete ({warmed}); see {LOG_DIR}")
        run_ids = runs_create(args.runs, args.noops, user)
        worker_pids = cluster.worker_pids()
        server = postmaster_pid(monitor)
        cpu0 = process_tree_cpu(cluster.process.pid)
        server0 = process_tree_cpu(server) if server else {}
        x0, w0 = counters(monitor)
        t0 = time.time()
        released = tasks_release(monitor, cluster_queue)
        outcome = runs_wait(monitor, run_ids, args.timeout, cluster)
        cpu1 = process_tree_cpu(cluster.process.pid)
        server1 = process_tree_cpu(server) if server else {}
        x1, w1 = counters(monitor)
        if cluster.worker_pids() != worker_pids:
            print(f"workers={workers}: a worker was replaced inside the window (its CPU counts as the cluster's)",
                  file=sys.stderr)
    finally:
        cluster.stop()
    if outcome["timed_out"] or outcome["last_finished"] is None:
        raise SystemExit(f"workers={workers}: {outcome['ended']} of {len(run_ids)} runs ended within "
                         f"{args.timeout:.0f}s; see {LOG_DIR}")
    wall = outcome["last_finished"] - t0
    steps = args.runs * (2 * args.noops + 1)
    cluster_cpu = cpu_delta(cpu0, cpu1)
    worker_cpu = sum(s for pid, s in cluster_cpu.items() if pid in worker_pids)
    other_cpu = sum(cluster_cpu.values()) - worker_cpu
    server_cpu = sum(cpu_delta(server0, server1).values()) if server else None
    per_step = lambda seconds: None if seconds is None else seconds / steps * 1e6  # noqa: E731
    return {
        "workers": workers, "runs": args.runs, "steps_per_run": 2 * args.noops + 1, "steps": steps,
        "tasks_released": released, "completed": outcome["completed"], "ended": outcome["ended"],
        "steps_recorded": Step.objects.filter(run_id__in=run_ids).count(),
        "wall_s": wall, "steps_per_s": steps / wall, "runs_per_s": args.runs / wall, "us_per_step": wall / steps * 1e6,
        "worker_cpu_us_per_step": per_step(worker_cpu), "cluster_other_cpu_us_per_step": per_step(other_cpu),
        "cluster_cpu_us_per_step": per_step(worker_cpu + other_cpu), "server_cpu_us_per_step": per_step(server_cpu),
        "worker_cpu_utilisation": worker_cpu / wall / workers,
        "write_txns_per_step": (x1 - x0) / steps, "wal_bytes_per_step": (w1 - w0) / steps,
    }


def machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({model}), Python {platform.python_version()}"


def table(result: dict) -> str:
    lines = [
        "| workers | steps/s | runs/s | wall s | µs/step (wall/steps) | worker CPU µs/step | other cluster CPU µs/step "
        "| server CPU µs/step | write txns/step | WAL B/step |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    fmt = lambda x, nd=0: "-" if x is None else f"{x:,.{nd}f}"  # noqa: E731
    for row in result["by_workers"]:
        lines.append(
            f"| {row['workers']} | {fmt(row['steps_per_s'])} | {fmt(row['runs_per_s'], 1)} | {fmt(row['wall_s'], 2)} "
            f"| {fmt(row['us_per_step'])} | {fmt(row['worker_cpu_us_per_step'])} | {fmt(row['cluster_other_cpu_us_per_step'])} "
            f"| {fmt(row['server_cpu_us_per_step'])} | {fmt(row['write_txns_per_step'], 2)} | {fmt(row['wal_bytes_per_step'])} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--noops", type=int, default=10)
    parser.add_argument("--workers", default="1,2,4", help="worker process counts, comma-separated")
    parser.add_argument("--layer", choices=["none", "configured"], default="none",
                        help="live publishing off (as bench/compare.py's engine rows), or through the configured layer")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for one worker count's runs")
    parser.add_argument("--json", type=Path, help="also write the result document here")
    parser.add_argument("--serve-workers", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_workers:
        serve_workers(args.layer)
        return
    counts = [int(n) for n in args.workers.split(",") if n.strip()]
    # Ctrl-C or a SIGTERM from bench/compare.py must still stop the cluster (see Cluster.stop).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    LOG_DIR.mkdir(parents=True, exist_ok=True)
    os.environ["DATABASE_URL"] = url = bench_database_url()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("WARDEN_DEMO", "1")  # the demo world's noop tool
    os.environ.setdefault("WARDEN_LOG_LEVEL", "WARNING")
    os.environ["WARDEN_SCRIPTED_DELAY_SECONDS"] = "0"
    os.environ.pop("WARDEN_REDIS_BROKER", None)  # HELD_QUEUE is a row of the ORM broker's table
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)

    import django
    from django.conf import settings

    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "cluster_name": HELD_QUEUE}  # this process's tasks only
    django.setup()
    if args.layer == "none":
        layers_off(settings)
    import psycopg
    from django.contrib.auth import get_user_model
    from django_q.conf import Conf
    from django_q.models import Schedule

    assert Conf.CLUSTER_NAME == HELD_QUEUE != Conf.PREFIX
    swept = Schedule.objects.filter(func__endswith="tasks.sweep").delete()[0]
    user = get_user_model().objects.create(username="bench")
    monitor = psycopg.connect(url, autocommit=True)
    load_before = os.getloadavg()[0]
    rows = []
    for workers in counts:
        rows.append(measure(workers, args, env, user, monitor))
        print(f"workers {workers}: {rows[-1]['steps_per_s']:,.0f} steps/s, {rows[-1]['runs_per_s']:,.1f} runs/s",
              file=sys.stderr)
    monitor.close()
    layer = "none" if args.layer == "none" else settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1]
    result = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
        "runs": args.runs, "noops": args.noops, "steps_per_run": 2 * args.noops + 1, "layer": layer,
        "q_cluster": {"poll": Conf.POLL, "bulk": Conf.BULK, "save_limit": Conf.SAVE_LIMIT, "recycle": Conf.RECYCLE,
                      "broker": Conf.BROKER_CLASS or "orm"},
        "sweeper_schedules_removed": swept,
        "by_workers": rows,
    }
    print(json.dumps(result, indent=2))
    print("\n" + table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
