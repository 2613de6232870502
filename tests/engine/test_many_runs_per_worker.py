"""Issue 34: one worker process drives many runs at once while they wait on the model — with every
guarantee per run. Real worker processes (django-q2's cluster), the `openai` provider against a
local server speaking the Chat Completions wire format whose answers are held open (a slow model),
and the database's own view of connections."""

import os
import signal

import pytest
from django.db import connection
from django.test import override_settings

from engine.actions.cancel import run_cancel_request
from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from runs_app.models import Run, RunEvent, RunStatus, Step, StepKind, StepStatus
from sessions_app.models import MessageRole
from tests.support.factories import UserFactory
from tests.support.fake_openai_server import FakeOpenAIServer, Outcome
from tests.support.processes import wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

HELD_SECONDS = 600  # far longer than any test waits: a held answer ends only by release or disconnect
POOL = 8


@pytest.fixture
def model_server():
    with FakeOpenAIServer(fallback="scripted") as server:
        yield server


def _start(procs, server, label: str, *, runs_per_worker: int):
    return procs.start_workers(label, workers=1, env={
        "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "test", "WARDEN_RUNS_PER_WORKER": str(runs_per_worker),
        "WARDEN_WORKER_DB_POOL_SIZE": str(POOL), "PGAPPNAME": f"fleet-{label}",
        # The client's own read timeout never ends a held answer within a test.
        "OPENAI_TIMEOUT_SECONDS": str(2 * HELD_SECONDS),
    })


def _post_runs(count: int) -> list[tuple[Run, object]]:
    posted = []
    with override_settings(WARDEN_MODEL_PROVIDER="openai"):
        for number in range(count):
            user = UserFactory()
            session = session_open(owner=user, title=f"fleet {number}")
            posted.append((message_post(session=session, content=f"Question number {number}: the weather in Lisbon?",
                                        acting_user=user).run, user))
    return posted


def _connections(application_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application_name])
        return cursor.fetchone()[0]


def _layer_connections() -> int:
    """The worker's live layer (config/settings.py): Redis where REDIS_URL is set, else PostgreSQL
    with a pool of its own of at most 4."""
    return 0 if os.environ.get("REDIS_URL") else 4


def _answers(run: Run) -> int:
    """The run's final answers (assistant messages that ask for no tool)."""
    return sum(1 for calls in run.session.messages.filter(role=MessageRole.ASSISTANT).values_list("tool_calls", flat=True)
               if not calls)


def _claims(run_id) -> int:
    return RunEvent.objects.filter(run_id=run_id, type="run_status", payload__status="running",
                                   payload__phase="preparing_context").count()


def _seqs_gap_free(run_id) -> bool:
    seqs = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    return seqs == list(range(1, len(seqs) + 1))


def test_a_cancel_closes_one_runs_model_stream_while_fifty_others_in_the_process_go_on(procs, demo_world, model_server):
    for _ in range(51):
        model_server.enqueue(text=["It is sunny", " in Lisbon."], finish="stop", chunk_delay=HELD_SECONDS)
    _start(procs, model_server, "one", runs_per_worker=60)
    posted = _post_runs(51)

    # One process has all 51 model calls open at once, holding no database connection through them:
    # the worker's pool is 8; beside it its lease keeper's own connection, the live layer's own pool
    # (PostgreSQL layer only) and the cluster's sentinel, pusher (with its doorbell) and monitor.
    wait_for(lambda: model_server.in_flight() == 51, timeout=360, message="51 model calls in flight from one process")
    assert _connections("fleet-one") <= POOL + 1 + _layer_connections() + 4
    assert len({Run.objects.get(pk=run.id).lease_owner.split(":")[1] for run, _ in posted}) == 1  # one pid

    cancelled, owner = posted[0]
    request = model_server.request_number("Question number 0:")
    run_cancel_request(run=cancelled, acting_user=owner)
    # The stream is closed by the worker (the server sees its client go), not read to its end,
    # which the server would send only after HELD_SECONDS.
    wait_for(lambda: model_server.outcomes.get(request) == Outcome.CLIENT_DISCONNECTED, timeout=60,
             message="the cancelled run's model stream to be closed")
    wait_for(lambda: Run.objects.get(pk=cancelled.id).status == RunStatus.CANCELLED, timeout=60,
             message="the run to be cancelled")
    discarded = Step.objects.get(run=cancelled, kind=StepKind.MODEL)
    assert discarded.status == StepStatus.DISCARDED and "cancel" in discarded.discard_reason

    # The fifty others went on waiting on their model, their leases renewed meanwhile.
    others = [run for run, _ in posted[1:]]
    assert model_server.in_flight() == 50
    assert all(Run.objects.get(pk=run.id).status == RunStatus.RUNNING for run in others)
    model_server.release_held()
    wait_for(lambda: Run.objects.filter(pk__in=[r.id for r in others], status=RunStatus.COMPLETED).count() == 50,
             timeout=120, message="the fifty other runs to complete")
    for run in others:
        assert _answers(run) == 1 and _seqs_gap_free(run.id)
        assert _claims(run.id) == 1  # never taken over
    assert _answers(cancelled) == 0


def test_a_killed_process_holding_twenty_runs_mid_stream_has_each_completed_once(procs, demo_world, model_server):
    for _ in range(20):
        model_server.enqueue(text=["It is sunny", " in Lisbon."], finish="stop", chunk_delay=HELD_SECONDS)
    _start(procs, model_server, "doomed", runs_per_worker=30)
    posted = _post_runs(20)
    wait_for(lambda: model_server.in_flight() == 20, timeout=360, message="20 model calls in flight from one process")
    tokens = {run.id: Run.objects.get(pk=run.id).lease_token for run, _ in posted}

    procs.signal("doomed", signal.SIGKILL)
    model_server.release_held()  # the held answers find their client gone
    wait_for(lambda: model_server.in_flight() == 0, timeout=60, message="the held answers to end")
    # From here the server answers by the scripted rules at once.
    _start(procs, model_server, "successor", runs_per_worker=30)
    procs.start_sweeper()
    ids = [run.id for run, _ in posted]
    wait_for(lambda: Run.objects.filter(pk__in=ids, status=RunStatus.COMPLETED).count() == 20, timeout=180,
             message="every run to be taken over and completed")
    for run, _ in posted:
        assert Run.objects.get(pk=run.id).lease_token > tokens[run.id] and _claims(run.id) == 2  # taken over once
        assert _answers(run) == 1 and _seqs_gap_free(run.id)
        steps = list(Step.objects.filter(run=run, kind=StepKind.MODEL).order_by("index").values_list("status", "discard_reason"))
        assert steps[0] == (StepStatus.DISCARDED, "worker lost mid-stream; output discarded")
        assert steps[1:] and {status for status, _ in steps[1:]} == {StepStatus.COMPLETED}


def test_one_customers_runs_take_at_most_their_share_while_anothers_go_on(procs, demo_world, model_server):
    """WARDEN_CUSTOMER_MAX_RUNNING=1: a customer with three sessions gets one run at a time; a
    second customer's run is not kept waiting behind them; the others run once a slot is theirs."""
    for _ in range(2):
        model_server.enqueue(text=["It is sunny", " in Lisbon."], finish="stop", chunk_delay=HELD_SECONDS)
    procs.start_workers("limited", workers=1, env={
        "OPENAI_BASE_URL": model_server.base_url, "OPENAI_API_KEY": "test", "OPENAI_TIMEOUT_SECONDS": str(2 * HELD_SECONDS),
        "WARDEN_RUNS_PER_WORKER": "20", "WARDEN_CUSTOMER_MAX_RUNNING": "1",
    })
    busy, other = UserFactory(), UserFactory()
    with override_settings(WARDEN_MODEL_PROVIDER="openai"):
        busy_runs = [message_post(session=session_open(owner=busy, title=f"busy {n}"),
                                  content=f"Busy question {n}: the weather in Lisbon?", acting_user=busy).run for n in range(3)]
        other_run = message_post(session=session_open(owner=other, title="other"),
                                 content="Other question: the weather in Lisbon?", acting_user=other).run

    # Both customers have a model call open: the busy one exactly one, whatever its three sessions.
    wait_for(lambda: model_server.in_flight() == 2, timeout=120, message="one call of each customer in flight")
    assert model_server.request_number("Other question") is not None
    assert sum(model_server.request_number(f"Busy question {n}:") is not None for n in range(3)) == 1
    assert Run.objects.filter(pk__in=[r.id for r in busy_runs], status=RunStatus.RUNNING).count() == 1
    assert Run.objects.filter(pk__in=[r.id for r in busy_runs], status=RunStatus.QUEUED).count() == 2

    model_server.release_held()  # from here every answer comes at once
    ids = [r.id for r in busy_runs] + [other_run.id]
    wait_for(lambda: Run.objects.filter(pk__in=ids, status=RunStatus.COMPLETED).count() == 4, timeout=120,
             message="every run to complete, the busy customer's one after another")
    for run in busy_runs + [other_run]:
        assert _answers(run) == 1 and _claims(run.id) == 1


def test_a_run_whose_task_a_full_process_took_starts_in_a_process_with_a_free_slot(procs, demo_world, model_server):
    """django-q2's worker processes take tasks from one queue, whichever is idle first: a process
    whose slots are all busy may take a task another process could start now. It holds it at most
    WARDEN_SLOT_WAIT_SECONDS, then hands the run back to the queue (before, it held it a minute)."""
    for _ in range(3):
        model_server.enqueue(text=["It is sunny", " in Lisbon."], finish="stop", chunk_delay=HELD_SECONDS)
    _start(procs, model_server, "full", runs_per_worker=2)
    first_two = _post_runs(2)
    wait_for(lambda: model_server.in_flight() == 2, timeout=120, message="the first process's two slots busy")

    ((third, _),) = _post_runs(1)
    # Only the full process is there to take the third run's task; then one with free slots starts.
    _start(procs, model_server, "free", runs_per_worker=2)
    wait_for(lambda: model_server.in_flight() == 3, timeout=30,
             message="the third run in flight in the process with free slots, not held by the full one")
    assert Run.objects.get(pk=third.pk).status == RunStatus.RUNNING
    model_server.release_held()
    ids = [run.id for run, _ in first_two] + [third.id]
    wait_for(lambda: Run.objects.filter(pk__in=ids, status=RunStatus.COMPLETED).count() == 3, timeout=120,
             message="every run to complete")
    assert all(_claims(run_id) == 1 for run_id in ids)
