"""/metrics after a scripted scenario with real processes: a weather question whose worker is
stalled mid-stream and taken over (its late write refused), and the refund of SPEC §12 —
approval, a gateway timeout, reconciliation. Every family of issue 15 is asserted against what
the database says happened, scraped over HTTP from the real web server."""

import json
import os
import signal
import threading
from datetime import timedelta

import httpx
import pytest
from django.db.models import Sum
from django.utils import timezone

from approvals_app.models import Approval, ApprovalStatus
from engine.actions.approvals import approval_decide
from engine.actions.messages import message_post
from operations.models import ProcessRole
from runs_app.models import Run, RunEvent, RunStatus, Step, WaitReason
from sessions_app.api_keys import api_key_create
from engine.actions.sessions import session_open
from tests.support.console import ConsoleSocket, open_socket
from tests.support.factories import ToolCallFactory, UserFactory
from tests.support.metrics import samples, value
from tests.support.processes import wait_for
from demo.services import sim_fault_set
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = pytest.mark.django_db(transaction=True)


def _scrape(base_url: str) -> dict:
    response = httpx.get(f"{base_url}/metrics", timeout=30, trust_env=False)
    assert response.status_code == 200, response.text[:500]
    return samples(response.text)


def _status(run_id) -> str:
    return Run.objects.values_list("status", flat=True).get(pk=run_id)


def _post(user, text: str, **kwargs) -> Run:
    session = session_open(owner=user, title=text[:40])
    return message_post(session=session, content=text, acting_user=user, **kwargs).run


def _seconds(delta) -> float:
    return delta.total_seconds()


@pytest.mark.processes
def test_metrics_report_what_happened_in_a_refund_scenario(procs, demo_world, operator):
    from operations.liveness import heartbeat_thread_stop
    from operations.models import ProcessHeartbeat

    # Only the scenario's processes report: earlier tests drove runs in this process, and its
    # heartbeat (started when a test imported the ASGI application) would add their counts.
    heartbeat_thread_stop()
    ProcessHeartbeat.objects.filter(pid=os.getpid()).delete()
    customer = UserFactory(username="metrics-customer")
    # Prices per million tokens, read by the web process that answers the scrape.
    procs.base_env["WARDEN_MODEL_PRICES"] = json.dumps({"scripted": {"input": 3, "output": 15}})
    procs.start_web(simulator=True)

    # A worker stalls mid-stream; the sweeper revokes its lease, a successor finishes the run,
    # and the stalled worker's next write is refused when it wakes up.
    procs.start_workers("stalled", workers=1)
    weather = _post(customer, "What's the weather in Lisbon?", provider_options={"delay": 0.3})
    wait_for(lambda: Step.objects.filter(run=weather, kind="model", status="running").exclude(streamed_text="").exists(),
             message="the first worker to be mid-stream")
    procs.signal("stalled", signal.SIGSTOP)
    procs.start_workers("successor", workers=1, env={"WARDEN_SCRIPTED_DELAY_SECONDS": "0"})
    procs.start_sweeper()
    wait_for(lambda: _status(weather.id) == RunStatus.COMPLETED, timeout=90, message="the successor to finish the run")
    procs.signal("stalled", signal.SIGCONT)
    wait_for(lambda: value(_scrape(procs.base_url), "warden_fenced_writes_refused_total") == 1, timeout=60,
             message="the refused write to be counted")
    procs.stop("stalled")

    # The refund waits for the operator, watched by an SSE client meanwhile.
    refund = _post(customer, "Check order 9527 and refund it if it's eligible")
    wait_for(lambda: Run.objects.filter(pk=refund.id, status=RunStatus.WAITING, wait_reason=WaitReason.APPROVAL).exists(),
             timeout=90, message="the refund to wait for approval")
    _, key = api_key_create(owner=customer, name="metrics")
    streaming = threading.Event()
    stop = threading.Event()

    def watch():
        with httpx.stream("GET", f"{procs.base_url}/api/v1/runs/{refund.id}/events/stream",
                          headers={"Authorization": f"Bearer {key}"}, timeout=60, trust_env=False) as response:
            for _ in response.iter_lines():
                streaming.set()
                if stop.is_set():
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    wait_for(streaming.is_set, message="the SSE stream to start")
    # …and by the customer's console, over its websocket.
    console = ConsoleSocket(open_socket(procs, user=customer))
    console.subscribe(refund.session_id)
    waiting = wait_for(lambda: (lambda s: s if value(s, "warden_live_clients", transport="sse") == 1
                                and value(s, "warden_live_clients", transport="websocket") == 1 else None)(
        _scrape(procs.base_url)), timeout=60, message="the SSE client and the console to be counted")
    approval = Approval.objects.get(run=refund, status=ApprovalStatus.PENDING)
    assert value(waiting, "warden_approvals_pending", policy="operator") == 1
    age = value(waiting, "warden_approval_oldest_pending_age_seconds", policy="operator")
    assert 0 < age <= _seconds(timezone.now() - approval.requested_at)
    assert value(waiting, "warden_runs", status="waiting", phase="", wait_reason="approval") == 1
    console.connection.close()
    stop.set()

    sim_fault_set(target="refund", mode="timeout_after_booking", delay_seconds=3.0, count=1)
    approval_decide(approval=approval, decision="approve", note="metrics scenario", acting_user=operator)
    wait_for(lambda: _status(refund.id) == RunStatus.COMPLETED, timeout=90, message="the refund to complete")
    refund_call = ToolCall.objects.get(run=refund, tool_name="execute_refund")
    assert refund_call.resolution == "applied"  # it went through unknown and was reconciled

    watcher.join(timeout=60)  # the stream ends with the run
    claims = RunEvent.objects.filter(type="run_status", payload__has_key="lease_owner").count()
    last = {}

    def settled():
        last["scrape"] = found = _scrape(procs.base_url)
        ok = (value(found, "warden_queue_pickup_seconds_count") == claims
              and value(found, "warden_worker_tasks_total", outcome="completed") == 2  # flushed with the worker's next beat
              and value(found, "warden_live_clients", transport="sse") == 0
              and value(found, "warden_live_clients", transport="websocket") == 0)
        return found if ok else None

    try:
        found = wait_for(settled, timeout=60, message="every claim's pickup latency to be reported")
    except AssertionError:
        s = last.get("scrape", {})
        raise AssertionError(f"claims {claims}, pickups {value(s, 'warden_queue_pickup_seconds_count')}, "
                             f"sse {value(s, 'warden_live_clients', transport='sse')}, "
                             f"completed tasks {value(s, 'warden_worker_tasks_total', outcome='completed')}, "
                             f"takeovers {value(s, 'warden_lease_takeovers_total')}") from None

    # Runs by status / phase / wait reason, and their durations.
    assert value(found, "warden_runs", status="completed", phase="", wait_reason="") == 2
    assert value(found, "warden_run_duration_seconds_count", status="completed") == 2
    durations = [_seconds(r.finished_at - r.created_at) for r in Run.objects.all()]
    assert value(found, "warden_run_duration_seconds_sum", status="completed") == pytest.approx(sum(durations), abs=1e-3)
    assert value(found, "warden_run_duration_seconds_bucket", status="completed", le="+Inf") == 2
    for kind in ("model", "tools"):
        finished = Step.objects.filter(kind=kind, finished_at__isnull=False)
        assert value(found, "warden_step_duration_seconds_count", kind=kind) == finished.count() > 0
        assert value(found, "warden_step_duration_seconds_sum", kind=kind) == pytest.approx(
            sum(_seconds(s.finished_at - s.started_at) for s in finished), abs=1e-3)

    # Model calls (the runs' own budget counters agree), tokens and cost.
    model_calls = Run.objects.aggregate(n=Sum("model_calls"))["n"]
    assert value(found, "warden_model_calls_total", provider="scripted", agent="default") == model_calls > 2
    tokens = Step.objects.filter(kind="model").aggregate(i=Sum("input_tokens"), o=Sum("output_tokens"))
    assert value(found, "warden_model_tokens_total", provider="scripted", agent="default", direction="input") == tokens["i"] > 0
    assert value(found, "warden_model_tokens_total", provider="scripted", agent="default", direction="output") == tokens["o"] > 0
    cost = value(found, "warden_model_cost_usd_total", provider="scripted", agent="default")
    assert cost == pytest.approx((tokens["i"] * 3 + tokens["o"] * 15) / 1e6) and cost > 0

    # Tool calls by tool and outcome.
    assert value(found, "warden_tool_calls_total", tool="query_order", effect="read", outcome="succeeded") == 1
    assert value(found, "warden_tool_calls_total", tool="execute_refund", effect="write", outcome="succeeded") == 1
    for call in ToolCall.objects.values("tool_name", "effect", "status").distinct():
        expected = ToolCall.objects.filter(**call).count()
        assert value(found, "warden_tool_calls_total", tool=call["tool_name"], effect=call["effect"], outcome=call["status"]) == expected

    # Nothing waits for a person any more.
    assert value(found, "warden_approvals_pending", policy="operator") is None
    assert not any(name == "warden_unknown_tool_calls" for name, _ in found)

    # Leases: one takeover, one refused write; sweeps; queue pickup latency of every claim.
    assert value(found, "warden_lease_takeovers_total") == 1
    assert value(found, "warden_fenced_writes_refused_total") == 1
    assert value(found, "warden_worker_tasks_total", outcome="lease-lost") == 1
    assert value(found, "warden_worker_tasks_total", outcome="completed") == 2
    sweeps = sum(row["sweeps"] for row in ProcessHeartbeat.objects.filter(role=ProcessRole.SWEEPER).values_list("counters", flat=True))
    assert 0 < value(found, "warden_sweeps_total") <= sweeps
    assert value(found, "warden_queue_pickup_seconds_bucket", le="+Inf") == claims == 5
    assert value(found, "warden_queue_pickup_seconds_sum") >= 0

    # Live clients, and the processes that report.
    assert value(found, "warden_live_clients", transport="websocket") == 0
    assert value(found, "warden_processes", role="web") >= 1
    assert value(found, "warden_processes", role="worker") >= 1  # the successor (the stopped one fades after 30 s)
    assert value(found, "warden_processes", role="sweeper") == 1


def test_unknown_writes_and_their_age_are_reported(db, settings):
    from operations.metrics import read_families

    settings.WARDEN_METRICS_CACHE_SECONDS = 0
    call = ToolCallFactory(tool_name="execute_refund", effect="write", status=ToolCallStatus.UNKNOWN,
                           idempotency_key="k-1", started_at=timezone.now() - timedelta(minutes=5))
    ToolCall.objects.filter(pk=call.pk).update(finished_at=timezone.now() - timedelta(minutes=4), next_attempt_at=None)
    families = {f.name: f for f in read_families()}
    (count,) = families["warden_unknown_tool_calls"].samples
    (age,) = families["warden_unknown_tool_call_oldest_age_seconds"].samples
    assert count.labels == {"tool": "execute_refund"} and count.value == 1
    assert 240 <= age.value < 3600
    assert families["warden_unknown_tool_calls_for_people"].samples[0].value == 1


def test_metrics_need_the_token_or_an_allowed_address(client, settings):
    settings.WARDEN_METRICS_TOKEN = "s3cret"
    settings.WARDEN_METRICS_ALLOWED_IPS = ["10.1.2.3"]
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7").status_code == 401
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    response = client.get("/metrics", REMOTE_ADDR="192.0.2.7", HTTP_AUTHORIZATION="Bearer s3cret")
    assert response.status_code == 200 and b"warden_runs" in response.content
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    settings.WARDEN_METRICS_TOKEN = None
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7").status_code == 403
