"""The `warden` command, run as a real process against real servers: a session made, spoken in
and followed live with `warden tail` while a refund run goes to its completion (the operator
approving it through the client); runs found and shown; errors one line on stderr with the API's
code and a non-zero exit status."""

import json
import os
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from runs_app.models import Run, RunEvent, RunStatus
from tests.support.api import build_world
from tests.support.processes import wait_for
from warden_client import Warden

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

# The console script pip installs with the client (`pip install -e client`).
WARDEN = Path(sys.executable).parent / "warden"
REFUND_REQUEST = "Check order 9527 and refund it if it's eligible"
# `warden tail`'s line: "HH:MM:SS  run <8 hex>  #<seq> <type> <summary>"
TAIL_LINE = re.compile(r"^\d\d:\d\d:\d\d  run [0-9a-f]{8}  #(\d+)\s+(\w+)\s*(.*)$")


def warden(*args: str, key: str, url: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([str(WARDEN), *args], env=_env(key, url), capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, (args, result.returncode, result.stderr)
    return result


def _env(key: str, url: str) -> dict[str, str]:
    return {**os.environ, "WARDEN_URL": url, "WARDEN_API_KEY": key}


def test_warden_tail_shows_a_refund_run_live_to_its_completion(procs, demo_world, customer, customer_key, operator_key):
    procs.start_web(simulator=True)
    procs.start_workers(workers=2)
    procs.start_sweeper()
    session_id = warden("sessions", "new", "--title", "refund 9527", key=customer_key, url=procs.base_url).stdout.strip()

    tail = subprocess.Popen([str(WARDEN), "tail", session_id, "--until-idle"], env=_env(customer_key, procs.base_url),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in tail.stdout), daemon=True)
    reader.start()
    try:
        said = json.loads(warden("say", session_id, REFUND_REQUEST, "--json", key=customer_key, url=procs.base_url).stdout)
        assert said["disposition"] == "started_run"
        run_id = said["run"]["id"]

        with Warden(procs.base_url, operator_key, trust_env=False) as operator:
            approval = wait_for(lambda: next(iter(operator.approvals.list(run=run_id).items), None), timeout=90,
                                message="the refund's approval request")
            # Live: the tail shows the request while the run still waits on it.
            wait_for(lambda: any(" approval_requested " in line for line in lines), timeout=60,
                     message="warden tail to show the approval request")
            assert not any(re.search(r" run_status\s+completed", line) for line in lines)
            decided = operator.approvals.approve(approval.id, note="order 9527 checked")
            assert decided.status == "approved"

        assert tail.wait(timeout=120) == 0, tail.stderr.read()
        reader.join(timeout=30)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()

    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, (run.error_code, run.error_detail)
    shown = [TAIL_LINE.match(line) for line in lines]
    assert all(shown), lines
    stored = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "type"))
    assert [(int(match.group(1)), match.group(2)) for match in shown] == stored  # every event once, in order
    assert re.search(r"execute_refund succeeded", "\n".join(lines))
    assert shown[-1].group(2) == "run_status" and shown[-1].group(3).startswith("completed")
    assert "outcome applied" in shown[-1].group(3)
    # The desk's search finds it by the order, with the money its refund moved.
    found = json.loads(warden("runs", "list", "--q", "9527", "--json", key=customer_key, url=procs.base_url).stdout)
    assert [(item["id"], item["status"], item["money_moved"]) for item in found] == [
        (run_id, "completed", [{"amount": "25.00", "currency": "USD"}])]


def test_runs_are_found_and_shown_and_errors_are_one_line_with_the_apis_code(procs, customer_key):
    procs.start_web()
    url = procs.base_url
    session_id = warden("sessions", "new", "--title", "order 4411", key=customer_key, url=url).stdout.strip()
    said = warden("say", session_id, "Where is order 4411?", key=customer_key, url=url).stdout
    run_id = re.search(r"started_run: run ([0-9a-f-]{36}) \(queued\)", said).group(1)

    found = json.loads(warden("runs", "list", "--q", session_id, "--json", key=customer_key, url=url).stdout)
    assert [run["id"] for run in found] == [run_id] and found[0]["title"] == "order 4411"
    listed = warden("runs", "list", key=customer_key, url=url).stdout.splitlines()
    assert len(listed) == 1 and listed[0].startswith(run_id) and "queued" in listed[0]
    shown = json.loads(warden("--json", "runs", "show", run_id, key=customer_key, url=url).stdout)
    assert shown["id"] == run_id and shown["session_id"] == session_id and shown["status"] == "queued"
    assert warden("approvals", "list", key=customer_key, url=url).stdout == ""

    missing = warden("runs", "show", str(uuid.uuid4()), key=customer_key, url=url, check=False)
    assert missing.returncode == 1 and missing.stdout == ""
    # The line names the request, as the server's log lines for it do.
    assert re.fullmatch(r"warden: not_found \(404\): No such run\. \[request [0-9a-f]{32}\]\n", missing.stderr)
    unknown_key = warden("me", key="wdn_not-a-key", url=url, check=False)
    assert unknown_key.returncode == 1
    assert re.fullmatch(r"warden: invalid_api_key \(401\): Unknown API key\. \[request [0-9a-f]{32}\]\n", unknown_key.stderr)
    refused = warden("runs", "list", "--status", "sleeping", key=customer_key, url=url, check=False)
    assert refused.returncode == 1 and refused.stderr.startswith("warden: validation_error (422): ")
    no_key = warden("me", key="", url=url, check=False)
    assert no_key.returncode == 2 and "WARDEN_API_KEY" in no_key.stderr


def test_an_operator_lists_and_rejects_approvals_and_a_customer_cancels_and_reads(procs, customer, customer_key,
                                                                                  operator_key):
    world = build_world(customer)
    procs.start_web()
    url = procs.base_url

    queue = warden("approvals", "list", key=operator_key, url=url).stdout.splitlines()
    assert [line.split()[0] for line in queue] == [str(world.operator_approval.pk)]
    assert "execute_refund" in queue[0] and "operator" in queue[0]
    rejected = warden("approvals", "reject", str(world.operator_approval.pk), "--reason", "a duplicate",
                      "--customer-message", "This order was refunded already.", key=operator_key, url=url)
    assert rejected.stdout == f"rejected: approval {world.operator_approval.pk}\n"
    world.operator_approval.refresh_from_db()
    assert (world.operator_approval.status, world.operator_approval.note, world.operator_approval.customer_message) == (
        "rejected", "a duplicate", "This order was refunded already.")
    again = warden("approvals", "approve", str(world.operator_approval.pk), key=operator_key, url=url, check=False)
    assert again.returncode == 1 and re.fullmatch(r"warden: \w+ \(409\): .+\n", again.stderr)
    assert json.loads(warden("approvals", "list", "--all", "--json", key=operator_key, url=url).stdout)

    cancelled = warden("runs", "cancel", str(world.approval_run.pk), "--reason", "changed my mind", key=customer_key, url=url)
    assert cancelled.stdout.startswith(f"cancel requested: run {world.approval_run.pk} ")
    assert Run.objects.get(pk=world.approval_run.pk).cancel_reason == "changed my mind"
    shown = warden("sessions", "show", str(world.session.pk), key=customer_key, url=url).stdout
    assert "refund order 9527" in shown and "Done: refunded." in shown
    assert str(world.session.pk) in warden("sessions", "list", key=customer_key, url=url).stdout
    assert warden("me", key=operator_key, url=url).stdout.startswith("desk-operator (operator permissions: ")
