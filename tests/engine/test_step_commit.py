"""The hot path's one-statement step commits (engine/state/fast.py), against PostgreSQL.

They must write exactly what the general path writes, be taken on the hot path, and write
nothing at all when their fence or any status check misses — a lease lost mid-step, input
that arrived meanwhile (then the worker must not go on from the checkpoint it holds), or a
tool call moved under it. The engine runs in this process, as a worker task runs it."""

import dataclasses

import pytest
from django.core.management import call_command
from django.db import connection

from engine import state
from engine.actions.messages import message_post
from engine.context import manifest_covers
from engine.loop import run_drive
from agents.models import Agent
from notifications.models import NotificationKind, WebhookDelivery, WebhookEndpoint
from runs_app.models import Run, RunEvent, RunStatus, Step
from sessions_app.models import InputMode, Message, Session
from engine.actions.sessions import session_open
from tests.support.factories import UserFactory
from tools_app import registry
from demo.agent import DEMO_AGENT_SLUG
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = pytest.mark.django_db(transaction=True)

ONE_STATEMENT = "warden_fence_check("


def start(text: str, user=None) -> Run:
    user = user or UserFactory()
    session = session_open(owner=user, title="t")
    return message_post(session=session, content=text, acting_user=user, provider_options={"delay": 0}).run


def drive(run: Run) -> tuple[Run, list[str]]:
    """Drive the run once, as a worker task does; returns it and the statements sent."""
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        run_drive(run_id=str(run.id))
    run.refresh_from_db()
    return run, sent


def written(run: Run) -> dict:
    """What a run left in the database, without ids, times and random call ids."""
    hidden = {"tool_call", "tool_call_id", "lease_owner"}
    return {
        "run": (run.status, run.model_calls, run.step_count, run.tokens_used, run.event_seq, run.snapshot_version),
        "events": [(e.seq, e.type, {k: v for k, v in e.payload.items() if k not in hidden})
                   for e in RunEvent.objects.filter(run=run).order_by("seq")],
        "steps": [(s.index, s.kind, s.status, s.input_tokens, s.output_tokens, s.finish_reason, s.context_manifest,
                   s.streamed_text, s.discard_reason, s.finished_at is not None, s.lease_token)
                  for s in Step.objects.filter(run=run).order_by("index")],
        "calls": [(c.step.index, c.index, c.tool_name, c.effect, c.status, c.arguments, c.result, c.attempts,
                   c.error_code, c.error_detail, c.started_at is not None, c.finished_at is not None, c.lease_token)
                  for c in ToolCall.objects.filter(run=run).select_related("step").order_by("step__index", "index")],
        "messages": [(m.seq, m.role, m.content, [{**c, "id": ""} for c in m.tool_calls], m.tool_name,
                      m.step.index if m.step else None, m.run_id == run.id)
                     for m in Message.objects.filter(session_id=run.session_id).select_related("step").order_by("seq")],
    }


def general_path_only(monkeypatch):
    """The engine as if the one-statement commits never took (each answers "not taken")."""
    monkeypatch.setattr(state, "reads_finished", lambda **kwargs: None)
    monkeypatch.setattr(state, "turn_with_reads", lambda **kwargs: None)
    monkeypatch.setattr(state, "turn_answered", lambda **kwargs: False)
    monkeypatch.setattr(state, "model_step_opened", lambda **kwargs: None)


def hook_noop(monkeypatch, during):
    """Run `during(ctx)` inside every noop call (in the tool's own thread and connection)."""
    tool = registry.tool_get("noop")

    def execute(ctx, args):
        during(ctx, args)
        return tool.execute(ctx, args)

    monkeypatch.setitem(registry._REGISTRY, "noop", dataclasses.replace(tool, execute=execute))


def assert_history_gap_free(session_id) -> None:
    seqs = list(Message.objects.filter(session_id=session_id).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    assert Session.objects.get(pk=session_id).message_seq == len(seqs)


@pytest.mark.parametrize("text", ["please run noop 3", "what is the weather in Paris"])
def test_one_statement_commits_write_what_the_general_path_writes(simulator, demo_world, monkeypatch, text):
    fast, sent = drive(start(text))
    assert fast.status == RunStatus.COMPLETED
    assert sum(ONE_STATEMENT in sql for sql in sent) >= 2  # the hot path was taken
    with monkeypatch.context() as patched:
        general_path_only(patched)
        slow, sent_slow = drive(start(text))
    assert slow.status == RunStatus.COMPLETED and not any(ONE_STATEMENT in sql for sql in sent_slow)
    assert written(fast) == written(slow)


def test_a_run_of_reads_costs_about_one_statement_a_step(demo_world):
    run, sent = drive(start("please run noop 10"))
    assert run.status == RunStatus.COMPLETED and run.step_count == 21
    # Every step boundary, from opening the first model step to the final answer.
    assert sum(ONE_STATEMENT in sql for sql in sent) == run.step_count + 1
    # and the claim (its read and its write) and the first context's two reads (summary, newest messages)
    assert len(sent) <= run.step_count + 5


def test_a_lease_lost_during_a_read_writes_nothing_more(demo_world, monkeypatch):
    run = start("please run noop 3")
    taken_at = {}

    def revoke(ctx, args):
        if args.i == 1:  # the second read: the worker has one-statement commits behind it
            taken_at["events"] = RunEvent.objects.filter(run_id=ctx.run_id).count()
            taken_at["messages"] = Message.objects.filter(session_id=ctx.session_id).count()
            Run.objects.filter(pk=ctx.run_id).update(lease_token=999)  # another worker holds it now

    hook_noop(monkeypatch, revoke)
    outcome = run_drive(run_id=str(run.id))
    assert outcome == "lease-lost"
    assert RunEvent.objects.filter(run=run).count() == taken_at["events"]
    assert Message.objects.filter(session_id=run.session_id).count() == taken_at["messages"]
    call = ToolCall.objects.get(run=run, arguments={"i": 1})
    assert call.status == ToolCallStatus.RUNNING  # left for the lease holder to recover
    assert_history_gap_free(run.session_id)


def test_input_that_arrives_during_a_read_is_seen_before_the_next_model_call(demo_world, monkeypatch):
    user = UserFactory()
    run = start("please run noop 2", user=user)

    def interject(ctx, args):
        if args.i == 0:
            session = Session.objects.get(pk=ctx.session_id)
            message_post(session=session, content="also, be brief", mode=InputMode.SUPPLEMENT, acting_user=user)

    hook_noop(monkeypatch, interject)
    run, _ = drive(run)
    assert run.status == RunStatus.COMPLETED
    supplement = Message.objects.get(session_id=run.session_id, content="also, be brief")
    applied = RunEvent.objects.get(run=run, type="input_applied")
    # The model call after the read saw it: the worker read its checkpoint and context again.
    later_model_steps = [s for s in Step.objects.filter(run=run, kind="model").order_by("index")
                         if manifest_covers(s.context_manifest, supplement.seq)]
    assert later_model_steps, "no model call was shown the supplement"
    first_shown = RunEvent.objects.get(run=run, type="step_completed", payload__step=later_model_steps[0].index)
    assert applied.seq < first_shown.seq
    assert_history_gap_free(run.session_id)


def test_a_tool_call_moved_under_the_worker_makes_the_statement_write_nothing(demo_world, monkeypatch):
    run = start("please run noop 2")
    moved = []

    def move(ctx, args):
        if args.i == 1 and not moved:
            moved.append(ctx.tool_call_id)
            # As if recovered elsewhere: the call is no longer the `running` one the worker holds.
            ToolCall.objects.filter(pk=ctx.tool_call_id).update(status=ToolCallStatus.PENDING)

    hook_noop(monkeypatch, move)
    run, _ = drive(run)
    assert run.status == RunStatus.COMPLETED
    call = ToolCall.objects.get(pk=moved[0])
    assert call.status == ToolCallStatus.SUCCEEDED
    # One tool message per call: the missed statement wrote none, the general path one.
    assert Message.objects.filter(session_id=run.session_id, role="tool").count() == 2
    assert_history_gap_free(run.session_id)
    seqs = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1)) and run.event_seq == len(seqs)


def test_input_that_arrives_during_a_model_call_is_not_forgotten(demo_world, monkeypatch):
    """Input queued while the model streams makes that turn's commit take the general path; the
    reads after it go one-statement again, and must not mark the input as seen: the next model
    call's safe point still applies it (a fresh read is not a look at the pending input)."""
    import engine.model_route as model_route

    user = UserFactory()
    run = start("please run noop 3", user=user)
    real_get_provider = model_route.get_provider
    calls = []

    class Interjecting:
        def __init__(self, provider):
            self._provider = provider

        def __getattr__(self, name):
            return getattr(self._provider, name)

        def stream(self, request):
            calls.append(request)
            if len(calls) == 2:  # the second model call: one-statement commits are behind it
                message_post(session=Session.objects.get(pk=run.session_id), content="also, be brief",
                             mode=InputMode.SUPPLEMENT, acting_user=user)
            yield from self._provider.stream(request)

    monkeypatch.setattr(model_route, "get_provider", lambda name, **kwargs: Interjecting(real_get_provider(name, **kwargs)))
    run, _ = drive(run)
    assert run.status == RunStatus.COMPLETED
    supplement = Message.objects.get(session_id=run.session_id, content="also, be brief")
    assert RunEvent.objects.filter(run=run, type="input_applied").count() == 1
    shown = [s.index for s in Step.objects.filter(run=run, kind="model").order_by("index")
             if manifest_covers(s.context_manifest, supplement.seq)]
    assert shown, "no model call was shown the supplement"
    assert_history_gap_free(run.session_id)


def test_input_waiting_when_the_run_answers_starts_the_next_run(demo_world, monkeypatch):
    """A queued input must start the next run in the commit that ends this one: the final answer's
    statement leaves that to run_end."""
    user = UserFactory()
    run = start("please run noop 2", user=user)

    def queue(ctx, args):
        if args.i == 1:
            message_post(session=Session.objects.get(pk=ctx.session_id), content="what is the weather in Paris",
                         mode=InputMode.QUEUE, acting_user=user)

    hook_noop(monkeypatch, queue)
    run, _ = drive(run)
    assert run.status == RunStatus.COMPLETED and run.outcome == "none"
    following = Run.objects.exclude(pk=run.pk).get(session_id=run.session_id)
    assert following.status == RunStatus.QUEUED
    assert following.messages.get().content == "what is the weather in Paris"


def test_a_subscribed_run_completed_notification_goes_to_the_outbox(demo_world):
    WebhookEndpoint.objects.create(name="done", url="https://example.invalid/hook", kinds=[NotificationKind.RUN_COMPLETED])
    run, _ = drive(start("please run noop 1"))
    assert run.status == RunStatus.COMPLETED
    completed = RunEvent.objects.get(run=run, type="run_status", payload__status="completed")
    (delivery,) = WebhookDelivery.objects.filter(run=run)
    assert (delivery.kind, delivery.event_seq) == (NotificationKind.RUN_COMPLETED, completed.seq)


def test_an_answer_after_a_write_ends_through_run_end_with_the_writes_outcome(simulator, demo_world):
    """The statement knows only the outcome of a run that asked for no write (`none`)."""
    call_command("demo_setup", verbosity=0)  # the demo agent: a refund of 4.50 needs no approval (DEMO.md)
    user = UserFactory()
    session = session_open(owner=user, title="t", agent=Agent.objects.get(slug=DEMO_AGENT_SLUG))
    run = message_post(session=session, content="Check order 9541 and refund it if it's eligible", acting_user=user,
                       provider_options={"delay": 0}).run
    run, _ = drive(run)
    assert run.status == RunStatus.COMPLETED, run.error_detail
    refund = ToolCall.objects.get(run=run, tool_name="execute_refund")
    assert refund.status == ToolCallStatus.SUCCEEDED and run.outcome == "applied"
