"""No model endpoint credential appears anywhere but in the request to its own model server (issue 32's
acceptance): an agent with an endpoint and a fallback, each with a distinctive key, runs through real
django-q2 workers; its endpoint fails once with an error that echoes the key (logged, then answered by
the fallback). Every API answer a client can fetch about the run, its steps, events and agent, the
desk's endpoint pages (list and change form) and the run's page, every line the workers and the
sweeper logged (at DEBUG), the /metrics output and the spans the workers exported (the console
exporter, into their logs) hold neither key nor its sealed form — while the servers did receive them."""

import sys
import uuid

import pytest
from django.test import Client

from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from runs_app.models import ModelEndpoint, RunStatus, Step, StepKind
from tests.support.agents import define, wait_for_run
from tests.support.api import Api
from tests.support.factories import ApiKeyFactory, EndpointModelFactory, ModelEndpointFactory, UserFactory
from tests.support.fake_openai_server import FakeOpenAIServer
from tests.support.processes import LOG_DIR, wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_no_endpoint_credential_shows_in_the_api_the_desk_the_logs_the_metrics_or_the_spans(procs):
    token = uuid.uuid4().hex
    keys = {"main": f"sk-main-{token}", "spare": f"sk-spare-{token}"}
    with FakeOpenAIServer(fallback="scripted") as main_server, FakeOpenAIServer(fallback="scripted") as spare_server:
        main = ModelEndpointFactory(name="main", base_url=main_server.base_url, credential=keys["main"])
        spare = ModelEndpointFactory(name="spare", base_url=spare_server.base_url, credential=keys["spare"])
        EndpointModelFactory(endpoint=main, name="big")
        EndpointModelFactory(endpoint=spare, name="spare-model")
        definer = UserFactory(username="agent-admin", is_staff=True, is_superuser=True)
        agent = define({"name": "Payouts", "instructions": "You are payouts.", "tools": ["noop"], "endpoint": "main",
                        "model": "big", "fallback_endpoint": "spare", "fallback_model": "spare-model"}, by=definer).agent
        verbose = {"WARDEN_LOG_LEVEL": "DEBUG", "WARDEN_Q_LOG_LEVEL": "DEBUG", "OTEL_TRACES_EXPORTER": "console",
                   "OTEL_BSP_SCHEDULE_DELAY": "100", "WARDEN_TRACE_SQL": "1"}
        procs.start_workers("secret-workers", env=verbose)
        procs.start("sweeper", [sys.executable, "manage.py", "sweep", "--loop", "--interval", "0.5"], env=verbose)
        # The agent's endpoint fails with an error text that quotes its key, as some servers do.
        main_server.enqueue(status=500, error_message=f"upstream rejected key {keys['main']}")
        customer = UserFactory()
        session = session_open(owner=customer, title="payout", agent=agent)
        run = message_post(session=session, content="run 1 no-op", acting_user=customer).run
        wait_for_run(run.id, RunStatus.COMPLETED)

    # The keys did go where they belong: each server received its own, and the fallback answered.
    assert set(main_server.authorizations) == {f"Bearer {keys['main']}"}
    assert set(spare_server.authorizations) == {f"Bearer {keys['spare']}"}
    assert Step.objects.filter(run_id=run.id, kind=StepKind.MODEL, endpoint="spare").exists()

    secrets = [*keys.values(), *ModelEndpoint.objects.values_list("credential", flat=True)]
    assert all(secrets) and len(secrets) == 4
    api = Api(ApiKeyFactory(owner=customer).secret)
    admin_api = Api(ApiKeyFactory(owner=definer).secret)
    desk = Client()
    desk.force_login(UserFactory(username="endpoint-admin", is_staff=True, is_superuser=True))
    pages = {
        "run": api.get(f"/runs/{run.id}"), "events": api.get(f"/runs/{run.id}/events"),
        "session": api.get(f"/sessions/{session.id}"), "agents": admin_api.get("/agents"),
        "agent": admin_api.get(f"/agents/{agent.slug}"), "operator's run": admin_api.get(f"/runs/{run.id}"),
        "endpoint list": desk.get("/admin/runs_app/modelendpoint/"),
        "main's form": desk.get(f"/admin/runs_app/modelendpoint/{main.pk}/change/"),
        "spare's form": desk.get(f"/admin/runs_app/modelendpoint/{spare.pk}/change/"),
        "run page": desk.get(f"/admin/runs_app/run/{run.id}/change/"),
        "agent page": desk.get(f"/admin/agents/agent/{agent.pk}/change/"),
        "metrics": Client().get("/metrics", REMOTE_ADDR="127.0.0.1"),
    }
    for name, page in pages.items():
        assert page.status_code == 200, (name, page.status_code)
    steps = pages["run"].json()["steps"]
    assert {s["endpoint"] for s in steps if s["kind"] == "model"} >= {"spare"}  # the steps are in what was checked
    assert b"warden_model_calls" in pages["metrics"].content
    worker_log_file = LOG_DIR / f"{procs.name}-secret-workers.log"
    # The spans are exported in batches: wait until the model calls' are in the log.
    wait_for(lambda: worker_log_file.read_text(errors="replace").count('"name": "model.call"') >= 2,
             message="the workers' spans to be exported")
    worker_log = worker_log_file.read_text(errors="replace")
    sweeper_log = (LOG_DIR / f"{procs.name}-sweeper.log").read_text(errors="replace")
    assert "asking fallback spare" in worker_log and "[credential]" in worker_log  # the failure was logged, redacted
    for secret in secrets:
        for name, page in pages.items():
            assert secret.encode() not in page.content, (name, secret)
        assert secret not in worker_log and secret not in sweeper_log, secret
