"""Chaos soak: many refund runs while worker clusters are SIGKILLed over and over.

Not part of `make test` (it runs for many minutes). Reports lost / duplicated / stuck counts
and the recovery time after a kill: from the SIGKILL to the moment an interrupted run is
claimed again (bounded below by the lease TTL plus the sweep interval).

Usage: python bench/chaos_soak.py [--runs 500] [--kills 200] [--clusters 3] [--lease 4] [--sweep 0.5]
Uses (and re-creates) the database warden_soak on DATABASE_URL's server (or the embedded one).
"""

import argparse
import os
import random
import signal
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SOAK_DB = "warden_soak"


def soak_database_url() -> str:
    import psycopg

    base = os.environ.get("DATABASE_URL")
    if not base:
        from config.embedded_db import embedded_database_url

        base = embedded_database_url(ROOT)
    parts = urlsplit(base)
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{SOAK_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{SOAK_DB}"')
    return urlunsplit(parts._replace(path=f"/{SOAK_DB}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--clusters", type=int, default=3)
    parser.add_argument("--lease", type=float, default=4.0)
    parser.add_argument("--sweep", type=float, default=0.5)
    parser.add_argument("--kill-every", type=float, default=1.5, help="mean seconds between kills")
    parser.add_argument("--settle", type=float, default=600, help="seconds allowed to settle after the last kill")
    args = parser.parse_args()

    os.environ["DATABASE_URL"] = soak_database_url()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("WARDEN_DEMO", "1")  # the demo world's refunds, and its simulated payment service
    import django

    django.setup()
    from django.contrib.auth.models import Permission
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from tests.support.chaos import approve_pending, post, refund_outcomes_are_honest, resting_correctly
    from tests.support.factories import UserFactory
    from tests.support.processes import ProcessGroup
    from demo.services import sim_order_upsert
    from runs_app.models import TERMINAL_STATUSES, Run, RunEvent

    for n in range(args.runs):
        sim_order_upsert(order_id=str(200000 + n), user_id="u1", amount=Decimal("10.00"))
    operator = UserFactory(username="soak-operator", is_staff=True)
    operator.user_permissions.add(*Permission.objects.filter(codename__in=["decide_approval", "reconcile_toolcall"]))

    group = ProcessGroup(name="soak", env={"WARDEN_LEASE_SECONDS": str(args.lease), "WARDEN_HEARTBEAT_SECONDS": str(args.lease / 4),
                                           "WARDEN_SWEEP_SECONDS": str(args.sweep)})
    rng = random.Random(7)
    faults = ["after_key_commit=die", "after_downstream_call=die", "mid_model_stream=die", ""]
    kills: list[float] = []
    started = time.monotonic()
    try:
        group.start_web()
        group.start_sweeper(args.sweep)
        labels = [f"cluster-{i}" for i in range(args.clusters)]
        envs = {label: {"WARDEN_FAULT_POINTS": rng.choice(faults)} for label in labels}
        for label in labels:
            group.start_workers(label, workers=1, env=envs[label])
        run_ids = []
        next_kill = time.monotonic() + rng.expovariate(1 / args.kill_every)
        while len(kills) < args.kills or len(run_ids) < args.runs:
            if len(run_ids) < args.runs:
                run_ids += [post(f"Check order {200000 + n} and refund it if it's eligible", provider_options={"delay": 0.01}).id
                            for n in range(len(run_ids), min(args.runs, len(run_ids) + 10))]
            approve_pending(operator)
            if time.monotonic() >= next_kill and len(kills) < args.kills:
                label = rng.choice(labels)
                group.signal(label, signal.SIGKILL)
                group.stop(label)
                kills.append(time.time())
                envs[label] = {"WARDEN_FAULT_POINTS": rng.choice(faults)}
                group.start_workers(label, workers=1, env=envs[label])
                next_kill = time.monotonic() + rng.expovariate(1 / args.kill_every)
            time.sleep(0.2)
        print(f"{len(run_ids)} runs posted, {len(kills)} kills in {time.monotonic() - started:.0f} s; settling", file=sys.stderr)
        for label in labels:
            group.stop(label)
        group.start_workers("healthy", workers=2)
        settle_until = time.monotonic() + args.settle
        while time.monotonic() < settle_until:
            approve_pending(operator)
            if not Run.objects.filter(pk__in=run_ids).exclude(status__in=TERMINAL_STATUSES).exists():
                break
            time.sleep(1)
    finally:
        group.stop_all()

    runs = list(Run.objects.filter(pk__in=run_ids))
    lost = args.runs - len(runs)
    stuck = [r for r in runs if not resting_correctly(r)]
    problems = refund_outcomes_are_honest(run_ids)
    duplicated = [p for p in problems if "booked" in p and "times" in p and not p.endswith("booked 1 times")]
    # Recovery: for each revoked lease, the time from the kill before it to the next claim.
    recoveries, detections, pickups = [], [], []
    for revoked in RunEvent.objects.filter(run_id__in=run_ids, type="run_status", payload__reason="lease expired"):
        claim = RunEvent.objects.filter(run_id=revoked.run_id, seq__gt=revoked.seq, type="run_status",
                                        payload__phase="preparing_context").order_by("seq").first()
        before = [k for k in kills if k <= revoked.created_at.timestamp()]
        if claim and before:
            recoveries.append(claim.created_at.timestamp() - before[-1])
            detections.append(revoked.created_at.timestamp() - before[-1])
            pickups.append(claim.created_at.timestamp() - revoked.created_at.timestamp())
    by_status = {s: sum(1 for r in runs if r.status == s) for s in {r.status for r in runs}}
    print(f"runs {len(runs)}/{args.runs}  kills {len(kills)}  statuses {by_status}")
    print(f"lost {lost}  duplicated refunds {len(duplicated)}  stuck {len(stuck)}  other problems {len(problems) - len(duplicated)}")
    if recoveries:
        recoveries.sort()
        print(f"recovery after a kill (s): n={len(recoveries)} p50={statistics.median(recoveries):.1f} "
              f"p95={recoveries[int(0.95 * (len(recoveries) - 1))]:.1f} max={recoveries[-1]:.1f} "
              f"(lease {args.lease} s + sweep {args.sweep} s)")
        print(f"  of which kill → lease revoked: p50={statistics.median(detections):.1f} max={max(detections):.1f}; "
              f"revoked → claimed by a live worker: p50={statistics.median(pickups):.1f} max={max(pickups):.1f}")
    for p in problems[:20]:
        print("problem:", p)


if __name__ == "__main__":
    main()
