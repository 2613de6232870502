"""Issue 32, model endpoints as data, through real django-q2 worker processes: two agents of one
deployment call two model endpoints at once (two servers speaking the Chat Completions wire
format), each server receiving only its own agent's calls with its own key; a key rotated in the
desk is what the next call sends, the workers never restarted; and no credential shows up in the
API, the stored run, or any log line the workers wrote."""

import uuid

import pytest
from django.test import Client

from agents.models import Agent
from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from runs_app.models import Run, RunEvent, RunStatus, Step, StepKind
from tests.support.agents import define, wait_for_run
from tests.support.api import Api
from tests.support.factories import ApiKeyFactory, EndpointModelFactory, ModelEndpointFactory, UserFactory
from tests.support.fake_openai_server import FakeOpenAIServer
from tests.support.processes import LOG_DIR, free_port

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

WORKERS = "endpoint-workers"


@pytest.fixture
def servers():
    # A little pause between streamed chunks: the two agents' calls overlap in time.
    with FakeOpenAIServer(fallback="scripted", scripted_delay=0.02) as a, FakeOpenAIServer(fallback="scripted", scripted_delay=0.02) as b:
        yield a, b


def _keys() -> dict[str, str]:
    """Keys of this test alone, so a grep of the (appended) process logs finds only this test's."""
    token = uuid.uuid4().hex
    return {name: f"sk-{name}-{token}" for name in ("a", "a-rotated", "b", "env")}


def _agent(slug: str, endpoint: str, model: str, *, by) -> Agent:
    return define({"name": slug, "slug": slug, "instructions": f"You are {slug}.", "tools": ["noop"],
                   "endpoint": endpoint, "model": model}, by=by).agent


def _ask(agent: Agent, text: str) -> tuple[Run, object]:
    customer = UserFactory()
    session = session_open(owner=customer, title=text, agent=agent)
    return message_post(session=session, content=text, acting_user=customer).run, session


def _model_calls(run_id) -> int:
    return Step.objects.filter(run_id=run_id, kind=StepKind.MODEL).count()


def test_two_agents_call_two_endpoints_and_a_rotated_key_is_used_by_the_next_call(procs, servers):
    server_a, server_b = servers
    keys = _keys()
    team_a = ModelEndpointFactory(name="team-a", base_url=server_a.base_url, credential=keys["a"])
    team_b = ModelEndpointFactory(name="team-b", base_url=server_b.base_url, credential=keys["b"], max_concurrency=2)
    EndpointModelFactory(endpoint=team_a, name="model-a")
    EndpointModelFactory(endpoint=team_b, name="model-b")
    # Superusers: after some process tests (tests/agents/test_own_agent_doc.py) the permission rows are gone.
    definer = UserFactory(username="agent-admin", is_staff=True, is_superuser=True)
    agent_a = _agent("agent-a", "team-a", "model-a", by=definer)
    agent_b = _agent("agent-b", "team-b", "model-b", by=definer)
    # The default endpoint (the environment) answers nothing: a call that fell back to it would fail.
    procs.start_workers(WORKERS, workers=2, env={"OPENAI_BASE_URL": f"http://127.0.0.1:{free_port()}/v1",
                                                 "OPENAI_API_KEY": keys["env"],
                                                 # Everything the workers log, for the grep below.
                                                 "WARDEN_LOG_LEVEL": "DEBUG", "WARDEN_Q_LOG_LEVEL": "DEBUG"})

    run_a, session_a = _ask(agent_a, "run 2 no-ops")
    run_b, session_b = _ask(agent_b, "run 3 no-ops")
    wait_for_run(run_a.id, RunStatus.COMPLETED)
    wait_for_run(run_b.id, RunStatus.COMPLETED)

    # Each server got exactly its own agent's calls, with its own model and key.
    assert len(server_a.requests) == _model_calls(run_a.id) == 3
    assert len(server_b.requests) == _model_calls(run_b.id) == 4
    assert {r["model"] for r in server_a.requests} == {"model-a"} and {r["model"] for r in server_b.requests} == {"model-b"}
    assert all("You are agent-a." in str(r["messages"]) for r in server_a.requests)
    assert all("You are agent-b." in str(r["messages"]) for r in server_b.requests)
    assert set(server_a.authorizations) == {f"Bearer {keys['a']}"}
    assert set(server_b.authorizations) == {f"Bearer {keys['b']}"}

    # The key is rotated in the desk, as an operator would; the workers keep running.
    desk = Client()
    desk.force_login(UserFactory(username="endpoint-admin", is_staff=True, is_superuser=True))
    rotated = desk.post(f"/admin/runs_app/modelendpoint/{team_a.pk}/change/", {
        "name": "team-a", "kind": "chat_completions", "base_url": server_a.base_url, "new_credential": keys["a-rotated"],
        "max_concurrency": "", "timeout_seconds": "60", "connect_timeout_seconds": "10",
        "offered_models-TOTAL_FORMS": "0", "offered_models-INITIAL_FORMS": "0"})
    assert rotated.status_code == 302
    asked_before = len(server_a.requests)
    second = message_post(session=session_a, content="run 1 no-op", acting_user=session_a.owner).run
    wait_for_run(second.id, RunStatus.COMPLETED)
    after = server_a.authorizations[asked_before:]
    assert after and set(after) == {f"Bearer {keys['a-rotated']}"}
    assert len(server_b.requests) == 4  # nothing of agent A's went to B

    # A server that echoes the key it refused: the run fails, and the text it keeps is redacted.
    server_b.enqueue(status=401, error_message=f"Incorrect API key provided: {keys['b']}.")
    refused = message_post(session=session_b, content="run 1 no-op", acting_user=session_b.owner).run
    wait_for_run(refused.id, RunStatus.FAILED)
    assert "Incorrect API key provided: [credential]" in Run.objects.get(pk=refused.id).error_detail

    # No credential anywhere a person or a log reader can look.
    secrets = [keys["a"], keys["a-rotated"], keys["b"], keys["env"]]
    api = Api(ApiKeyFactory(owner=session_a.owner).secret)
    admin_api = Api(ApiKeyFactory(owner=definer).secret)
    api_b = Api(ApiKeyFactory(owner=session_b.owner).secret)
    shown = [api.get(f"/runs/{second.id}").content, api.get(f"/runs/{run_a.id}").content,
             api_b.get(f"/runs/{refused.id}").content, api_b.get(f"/runs/{refused.id}/events").content,
             api.get(f"/runs/{run_a.id}/events").content, admin_api.get("/agents").content,
             desk.get(f"/admin/runs_app/modelendpoint/{team_a.pk}/change/").content,
             desk.get(f"/admin/runs_app/run/{run_a.id}/change/").content]
    stored = [str(list(Run.objects.values())), str(list(RunEvent.objects.values_list("payload", flat=True))),
              str(list(Step.objects.values()))]
    logs = (LOG_DIR / f"{procs.name}-{WORKERS}.log").read_text(errors="replace")
    assert refused.id.hex in logs.replace("-", "")  # the log does tell of the refused call
    for secret in secrets:
        assert not any(secret.encode() in page for page in shown), secret
        assert not any(secret in text for text in stored), secret
        assert secret not in logs, secret
