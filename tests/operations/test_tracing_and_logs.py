"""Traces and logs that say which run they are about (docs/OPERATIONS.md). Spans: a run's time
slice is the parent of each model call and each tool call (and an instrumented HTTP call is the
child of its tool call), all tagged with the run, session, step and tool-call ids and the lease
token — exported here to an in-memory exporter. Logs: a real worker's lines are JSON and carry
run_id."""

import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.utils import timezone
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from approvals_app.models import Approval
from config.tracing import tracing_reset, tracing_setup
from engine.actions.approvals import approval_decide
from engine.actions.messages import message_post
from engine.loop import run_drive
from runs_app.models import Run, RunStatus, Step
from engine.actions.sessions import session_open
from tests.support.api import build_world
from tests.support.factories import UserFactory
from tests.support.processes import LOG_DIR, wait_for
from tools_app.models import ToolCall

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=[False, True], ids=["default", "sql-spans"])
def spans(request):
    """Tracing on, exported in memory; SQL statement spans (WARDEN_TRACE_SQL) off, then on."""
    exporter = InMemorySpanExporter()
    exporter.sql = request.param
    tracing_setup(exporter=exporter, sql=request.param)
    connection.close()  # the next connection is opened through the psycopg instrumentation
    yield exporter
    tracing_reset()
    connection.close()


def test_a_runs_spans_nest_model_and_tool_calls_under_its_time_slice(simulator, demo_world, spans):
    # `simulator`: the simulated services the weather tool calls over HTTP.
    user = UserFactory()
    session = session_open(owner=user, title="tracing")
    run = message_post(session=session, content="What's the weather in Paris?", acting_user=user,
                       provider_options={"delay": 0}).run
    assert run_drive(run_id=str(run.id)) == "completed"
    stored = Run.objects.get(pk=run.pk)

    finished = spans.get_finished_spans()
    (root,) = [s for s in finished if s.name == "run.slice"]
    models = [s for s in finished if s.name == "model.call"]
    tools = [s for s in finished if s.name == "tool.call"]
    assert root.parent is None
    assert len(models) == Step.objects.filter(run=run, kind="model").count() == 2
    assert len(tools) == ToolCall.objects.filter(run=run).count() == 1
    for child in models + tools:
        assert child.parent.span_id == root.context.span_id and child.context.trace_id == root.context.trace_id
    for current in (root, *models, *tools):
        assert current.attributes["warden.run_id"] == str(run.id)
        assert current.attributes["warden.session_id"] == str(session.id)
        assert current.attributes["warden.lease_token"] == stored.lease_token
    assert root.attributes["warden.outcome"] == "completed"
    steps = dict(Step.objects.filter(run=run, kind="model").values_list("index", "pk"))
    assert sorted((m.attributes["warden.step"], m.attributes["warden.step_id"]) for m in models) == sorted(steps.items())
    assert all(m.attributes["warden.finish_reason"] in ("stop", "tool_calls") for m in models)
    (call,) = ToolCall.objects.filter(run=run)
    (tool,) = tools
    assert tool.attributes["warden.tool_call"] == str(call.id) and tool.attributes["warden.tool"] == "get_weather"
    assert tool.attributes["warden.tool_call_id"] == call.tool_call_id and tool.attributes["warden.step_id"] == call.step_id
    # The instrumentations: the tool's HTTP request (httpx) nests too, and with WARDEN_TRACE_SQL
    # the engine's SQL (psycopg); without it no statement has a span of its own.
    http = [s for s in finished if s.parent is not None and s.parent.span_id == tool.context.span_id]
    assert http and all(s.attributes.get("http.request.method", s.attributes.get("http.method")) == "GET" for s in http)
    sql = [s for s in finished if s.parent is not None and s.parent.span_id == root.context.span_id
           and s.attributes.get("db.system", s.attributes.get("db.system.name")) == "postgresql"]
    assert bool(sql) is spans.sql


@pytest.mark.processes
def test_a_workers_log_lines_are_json_and_carry_the_run(procs, demo_world):
    procs.start_web(simulator=True)
    procs.start_workers(env={"WARDEN_LOG_FORMAT": "json"})
    user = UserFactory()
    session = session_open(owner=user, title="logs")
    run = message_post(session=session, content="What's the weather in Paris?", acting_user=user).run
    wait_for(lambda: Run.objects.filter(pk=run.pk, status=RunStatus.COMPLETED).exists(), timeout=90, message="the run to complete")
    log = LOG_DIR / f"{procs.name}-workers.log"

    def ours():
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        return [json.loads(line) for line in lines if json.loads(line).get("run_id") == str(run.id)] if lines else []

    records = wait_for(ours, timeout=30, message="the worker to log about the run")
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert all(isinstance(json.loads(line), dict) for line in lines)  # every line is one JSON object
    (ended,) = [r for r in records if r["message"].endswith("time slice ended: completed")]
    assert ended["session_id"] == str(session.id) and ended["lease_token"] == Run.objects.get(pk=run.pk).lease_token
    assert ended["level"] == "INFO" and ended["logger"] == "warden.engine" and ended["outcome"] == "completed"
    assert ended["worker"].count(":") == 2  # host:pid:nonce


def test_plain_text_logs_show_the_run_context_for_development():
    import logging

    from config.logs import RunContextFilter, log_context

    record = logging.LogRecord("warden.engine", logging.INFO, __file__, 1, "hello", (), None)
    with log_context(run_id="r-1", lease_token=3):
        RunContextFilter().filter(record)
    formatter = logging.Formatter("%(levelname)s %(run_context)s%(message)s")
    assert formatter.format(record) == "INFO [run_id=r-1 lease_token=3] hello"


def test_a_human_decision_has_a_span_from_request_to_outcome_with_tier_wait_and_milestones(db):
    """Issue 31, point 5: the decision's span starts when the request was made and ends when it was
    decided (real moments, not when the span was written), carries the tier and the wait, and marks
    when the deciders were notified and when it was escalated."""
    world = build_world(UserFactory())
    approval = world.operator_approval
    requested = timezone.now() - timedelta(minutes=40)
    Approval.objects.filter(pk=approval.pk).update(
        requested_at=requested, notified_at=requested + timedelta(seconds=1),
        escalated_at=requested + timedelta(minutes=30), escalated_to="leads")
    lead = UserFactory(username="lead-lee")
    lead.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    exporter = InMemorySpanExporter()
    tracing_setup(exporter=exporter)
    try:
        approval_decide(approval=approval, decision="reject", acting_user=lead, note="not this one")
    finally:
        tracing_reset()
    (decision,) = [s for s in exporter.get_finished_spans() if s.name == "approval.decision"]
    stored = Approval.objects.get(pk=approval.pk)
    assert decision.start_time == int(requested.timestamp() * 1e9)
    assert decision.end_time == int(stored.decided_at.timestamp() * 1e9)
    attributes = decision.attributes
    assert attributes["warden.tier"] == "operator" and attributes["warden.outcome"] == "rejected"
    assert attributes["warden.decided_by"] == "lead-lee" and attributes["warden.escalated_to"] == "leads"
    assert attributes["warden.run_id"] == str(world.operator_run.pk)
    assert abs(attributes["warden.wait_seconds"] - (stored.decided_at - requested).total_seconds()) < 0.01
    assert [event.name for event in decision.events] == ["requested", "notified", "escalated", "rejected"]
