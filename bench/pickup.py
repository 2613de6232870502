"""Queue pickup on wake-up (issue 16, goal 3): from the commit of a posted message — or of an
approval — to a worker's claim of the run, on an idle cluster.

The system is real: a django-q2 cluster (`manage.py qcluster`, started as the tests start it,
tests/support/processes.py) in demo mode with the scripted model at zero delay, and for the
approvals the demo's simulated payment service. This process plays the web server: it posts
with the product's own functions (message_post, approval_decide), so its enqueue goes through
the configured broker too. One at a time: each run finishes, and the queue is empty, before the
next post; then a random 0.1–0.3 s pause, so the post lands at a random phase of a polling
broker's cycle and a doorbell broker is really asleep.

Measured per post: claim − commit, where commit is this process's clock right after the post's
transaction commits (an on_commit callback registered before the post's own, so it runs before
the enqueue) and claim is the `created_at` of the run's `run_status running / preparing_context`
event, stamped by the worker in run_claim (the same machine's clock). For an approval: the
run's second such event, against the commit of approval_decide.

--doorbell on: engine/broker.py's LISTEN/NOTIFY broker (the default); off: django-q2's ORM
broker polling every WARDEN_Q_POLL (0.05 s unless set).

Usage: python bench/pickup.py [--messages 200] [--approvals 30] [--doorbell on|off] [--workers 2]
                              [--json PATH]
Needs DATABASE_URL (or the embedded server). Uses (and re-creates) the database warden_bench_pickup.
"""

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BENCH_DB = "warden_bench_pickup"
WARM_UP = 3
ORDER_BASE = 700000


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


def committed_at(action):
    """Run `action` in a transaction; return its result and the wall-clock time of the commit."""
    from django.db import transaction

    stamp: list[float] = []
    with transaction.atomic():
        transaction.on_commit(lambda: stamp.append(time.time()))  # first: runs before the enqueue
        result = action()
    return result, stamp[0]


def wait_until(predicate, *, timeout: float = 60.0, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)
    return value


def idle_pause(rng) -> None:
    """The queue empty (every task acknowledged), then a random pause."""
    from django_q.models import OrmQ

    wait_until(lambda: not OrmQ.objects.exists(), what="the queue to empty")
    time.sleep(rng.uniform(0.1, 0.3))


def claim_time(run_id, nth: int) -> float:
    from runs_app.models import RunEvent

    claims = RunEvent.objects.filter(run_id=run_id, type="run_status", payload__status="running",
                                     payload__phase="preparing_context").order_by("seq")
    return claims[nth - 1].created_at.timestamp()


def status_of(run_id) -> tuple[str, str]:
    from runs_app.models import Run

    return Run.objects.values_list("status", "wait_reason").get(pk=run_id)


def message_pickup(user, rng) -> float:
    from engine.actions.messages import message_post
    from runs_app.models import TERMINAL_STATUSES
    from engine.actions.sessions import session_open

    session = session_open(owner=user, title="bench pickup")
    idle_pause(rng)
    result, commit = committed_at(lambda: message_post(session=session, content="please run noop 1", acting_user=user))
    wait_until(lambda: status_of(result.run.id)[0] in TERMINAL_STATUSES, what="the run to finish")
    return claim_time(result.run.id, 1) - commit


def approval_pickup(user, operator, order_id: str, rng) -> float:
    from approvals_app.models import Approval
    from engine.actions.approvals import approval_decide
    from engine.actions.messages import message_post
    from runs_app.models import TERMINAL_STATUSES, RunStatus, WaitReason
    from engine.actions.sessions import session_open

    session = session_open(owner=user, title="bench pickup approval")
    run = message_post(session=session, content=f"Check order {order_id} and refund it if it's eligible", acting_user=user).run

    def at_rest():
        status = status_of(run.id)
        return status if status[0] in (RunStatus.WAITING, *TERMINAL_STATUSES) else None

    resting = wait_until(at_rest, what="the run to wait for its approval")
    if resting != (RunStatus.WAITING, WaitReason.APPROVAL):
        raise SystemExit(f"order {order_id}: the run came to rest as {resting}, not waiting for an approval")
    idle_pause(rng)
    approval = Approval.objects.get(run_id=run.id)
    _, commit = committed_at(lambda: approval_decide(approval=approval, decision="approve", note="bench", acting_user=operator))
    wait_until(lambda: status_of(run.id)[0] in TERMINAL_STATUSES, what="the approved run to finish")
    return claim_time(run.id, 2) - commit


def summary(seconds: list[float]) -> dict:
    if not seconds:
        return {"n": 0}
    ms = sorted(s * 1000 for s in seconds)

    def rank(p: float) -> float:  # nearest rank
        return ms[max(0, math.ceil(p / 100 * len(ms)) - 1)]

    return {"n": len(ms), "p50_ms": round(rank(50), 2), "p90_ms": round(rank(90), 2), "p99_ms": round(rank(99), 2),
            "mean_ms": round(statistics.fmean(ms), 2), "min_ms": round(ms[0], 2), "max_ms": round(ms[-1], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200, help="posts measured (after %d warm-up posts)" % WARM_UP)
    parser.add_argument("--approvals", type=int, default=30, help="approvals measured (0: none)")
    parser.add_argument("--doorbell", choices=["on", "off"], default="on",
                        help="engine/broker.py's LISTEN/NOTIFY broker, or django-q2's polling ORM broker")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of the cluster")
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH")
    args = parser.parse_args()

    url = bench_database_url()
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["WARDEN_DEMO"] = "1"
    os.environ["WARDEN_SCRIPTED_DELAY_SECONDS"] = "0"
    # This process enqueues too: the same broker as the cluster's.
    os.environ["WARDEN_Q_DOORBELL"] = "1" if args.doorbell == "on" else "0"
    os.environ.setdefault("WARDEN_LOG_LEVEL", "WARNING")
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        os.environ.pop(name, None)
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django.core.management import call_command
    from django_q.conf import Conf

    from tests.support.processes import ProcessGroup
    from demo.services import sim_order_upsert

    call_command("migrate", verbosity=0)
    call_command("seed_demo", verbosity=0)
    for n in range(args.approvals):
        sim_order_upsert(order_id=str(ORDER_BASE + n), user_id="u2", amount=Decimal("20.00"))
    users = get_user_model().objects
    customer = users.create(username="bench-customer")
    operator = users.create(username="bench-operator", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    broker = Conf.BROKER_CLASS or "django_q.brokers.orm.ORM"
    print(f"broker {broker}, poll {Conf.POLL} s, fallback poll {settings.WARDEN_Q_FALLBACK_POLL_SECONDS} s", file=sys.stderr)

    group = ProcessGroup(name=f"bench-pickup-{args.doorbell}", env={
        # Production-like engine timings, not the tests' short ones; no faults.
        "WARDEN_LEASE_SECONDS": "30", "WARDEN_HEARTBEAT_SECONDS": "10", "WARDEN_SWEEP_SECONDS": "5",
        "WARDEN_SCRIPTED_DELAY_SECONDS": "0", "WARDEN_ALLOW_FAULTS": "0",
        "WARDEN_Q_DOORBELL": os.environ["WARDEN_Q_DOORBELL"], "WARDEN_Q_POLL": str(Conf.POLL),
        "WARDEN_LOG_LEVEL": os.environ["WARDEN_LOG_LEVEL"],
    })
    rng = random.Random(16)
    messages, approvals = [], []
    load_before = os.getloadavg()[0]
    try:
        if args.approvals:
            group.start_sim()
        group.start_workers(workers=args.workers)
        for _ in range(WARM_UP):  # the cluster's start-up and each worker's first run
            message_pickup(customer, rng)
        for n in range(args.messages):
            messages.append(message_pickup(customer, rng))
            if (n + 1) % 50 == 0:
                print(f"{n + 1} posts: p50 {summary(messages)['p50_ms']} ms", file=sys.stderr)
        for n in range(args.approvals):
            approvals.append(approval_pickup(customer, operator, str(ORDER_BASE + n), rng))
    finally:
        group.stop_all()

    result = {
        "bench": "pickup", "doorbell": args.doorbell, "broker": broker, "poll_s": Conf.POLL,
        "fallback_poll_s": settings.WARDEN_Q_FALLBACK_POLL_SECONDS if args.doorbell == "on" else None,
        "workers": args.workers, "message_post": summary(messages), "approval": summary(approvals),
        # The figures mean something on an idle machine only: the 1-minute load average around the run.
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)], "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    m, a = result["message_post"], result["approval"]
    resume = f"{a['p50_ms']} | {a['p99_ms']} | {a['n']}" if a["n"] else "– | – | 0"
    print(
        "\n| broker | post → claim p50 ms | p99 ms | max ms | posts | approval → claim p50 ms | p99 ms | approvals |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| {'doorbell (LISTEN/NOTIFY)' if args.doorbell == 'on' else f'ORM, poll {Conf.POLL} s'} "
        f"| {m['p50_ms']} | {m['p99_ms']} | {m['max_ms']} | {m['n']} | {resume} |"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
