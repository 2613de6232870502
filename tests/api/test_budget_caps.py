"""Per-request budgets are capped (SPEC §17; issue 12, finding 5: customers raised their own budgets
50× — `max_model_calls: 1000`, `max_tokens: 1e7`, `deadline_seconds: 604800` were accepted). Above a
configured cap the request is a 403 naming the cap; only runs_app.exceed_budget_caps lets a caller
go above; the run records who set its budgets, and the API and the admin show it."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from runs_app.models import Run
from sessions_app.models import Message, PendingInput
from tests.support.api import Api, grant
from tests.support.factories import ApiKeyFactory, RunFactory, SessionFactory, UserFactory

pytestmark = pytest.mark.django_db

FINDING = {"max_model_calls": 1000, "max_tokens": 10_000_000, "deadline_seconds": 604_800}
CAPS = {"max_model_calls": ("WARDEN_MODEL_CALLS_CAP", 50), "max_tokens": ("WARDEN_TOKENS_CAP", 500_000),
        "deadline_seconds": ("WARDEN_DEADLINE_CAP_SECONDS", 14_400)}


def post(api, session, budgets):
    return api.post(f"/sessions/{session.pk}/messages", {"content": "refund order 9527", "budgets": budgets})


@pytest.mark.parametrize("field", list(FINDING))
def test_a_budget_above_its_cap_is_403_naming_the_cap_and_writes_nothing(alice, alice_api, field):
    session = SessionFactory(owner=alice)
    response = post(alice_api, session, {field: FINDING[field]})
    assert response.status_code == 403, response.content
    body = response.json()
    setting, cap = CAPS[field]
    assert body["code"] == "budget_over_cap"
    assert setting in body["message"] and f"at most {cap}" in body["message"]
    assert "runs_app.exceed_budget_caps" in body["message"]
    (error,) = body["fields"]
    assert error["field"] == f"body.budgets.{field}" and setting in error["message"] and str(cap) in error["message"]
    assert not Run.objects.filter(session=session).exists()
    assert not Message.objects.filter(session=session).exists()


def test_every_budget_over_its_cap_is_listed(alice, alice_api):
    response = post(alice_api, SessionFactory(owner=alice), FINDING)
    assert response.status_code == 403
    assert [f["field"] for f in response.json()["fields"]] == [f"body.budgets.{field}" for field in FINDING]


def test_input_for_an_active_run_with_budgets_over_the_cap_is_refused_too(alice, alice_api):
    session = SessionFactory(owner=alice)
    RunFactory(session=session, status="waiting", phase="", wait_reason="approval")
    assert post(alice_api, session, {"max_model_calls": 1000}).status_code == 403
    assert not PendingInput.objects.filter(session=session).exists()


def test_budgets_at_the_caps_are_accepted_and_the_run_records_who_set_them(alice, alice_api):
    at_caps = {field: cap for field, (_, cap) in CAPS.items()}
    response = post(alice_api, SessionFactory(owner=alice), at_caps)
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["run"]["id"])
    assert (run.max_model_calls, run.max_tokens, run.budgets_set_by) == (50, 500_000, alice)
    assert timedelta(hours=3, minutes=59) < run.deadline - timezone.now() <= timedelta(hours=4)
    budgets = alice_api.get(f"/runs/{run.pk}").json()["budgets"]
    assert (budgets["max_model_calls"], budgets["max_tokens"], budgets["set_by"]) == (50, 500_000, "alice")


def test_the_caps_are_settings(alice, alice_api, settings):
    settings.WARDEN_MODEL_CALLS_CAP = 5
    session = SessionFactory(owner=alice)
    refused = post(alice_api, session, {"max_model_calls": 6})
    assert refused.status_code == 403 and "at most 5 (the cap WARDEN_MODEL_CALLS_CAP)" in refused.json()["message"]
    assert post(alice_api, session, {"max_model_calls": 5}).status_code == 201


def test_only_the_exceed_budget_caps_permission_lets_a_caller_go_above(alice, alice_api):
    operator = grant(UserFactory(username="ops", is_staff=True), ("runs_app", "view_run"), ("runs_app", "change_run"),
                     ("approvals_app", "decide_approval"), ("tools_app", "reconcile_toolcall"))
    # No other operator power opens the caps: in their own session ops are capped like anyone.
    ops_api = Api(ApiKeyFactory(owner=operator).secret)
    assert post(ops_api, SessionFactory(owner=operator), FINDING).status_code == 403

    grant(alice, ("runs_app", "exceed_budget_caps"))
    response = post(alice_api, SessionFactory(owner=alice), FINDING)
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["run"]["id"])
    assert (run.max_model_calls, run.max_tokens, run.budgets_set_by) == (1000, 10_000_000, alice)
    assert alice_api.get(f"/runs/{run.pk}").json()["budgets"]["set_by"] == "alice"


def test_a_run_on_the_defaults_says_nobody_set_its_budgets(alice, alice_api, settings):
    response = alice_api.post(f"/sessions/{SessionFactory(owner=alice).pk}/messages", {"content": "hi"})
    run = Run.objects.get(pk=response.json()["run"]["id"])
    assert (run.max_model_calls, run.max_tokens, run.budgets_set_by) == (
        settings.WARDEN_MAX_MODEL_CALLS, settings.WARDEN_MAX_TOKENS, None)
    assert alice_api.get(f"/runs/{run.pk}").json()["budgets"]["set_by"] is None


def test_the_admin_shows_who_set_a_runs_budgets(alice, alice_api):
    response = post(alice_api, SessionFactory(owner=alice), {"max_model_calls": 7})
    chosen = Run.objects.get(pk=response.json()["run"]["id"])
    defaults = RunFactory()
    viewer = grant(UserFactory(username="desk", is_staff=True), ("runs_app", "view_run"))
    desk = Client()
    desk.force_login(viewer)
    page = desk.get(f"/admin/runs_app/run/{chosen.pk}/change/").content.decode()
    assert "budgets set by" in page.lower() and "alice, in their request" in page
    assert "the deployment&#x27;s defaults" in desk.get(f"/admin/runs_app/run/{defaults.pk}/change/").content.decode()


def retry(api, run, budgets):
    return api.post(f"/runs/{run.pk}/retry", {"reason": "try again", "budgets": budgets})


def test_retrying_a_run_cannot_raise_its_budgets_above_the_caps(alice, alice_api):
    """The caps hold on every path that starts a run: a customer who cancels their own run and
    retries it with the finding's budgets is refused, and no new run exists."""
    ended = RunFactory(session=SessionFactory(owner=alice), status="cancelled", phase="", wait_reason="",
                       finished_at=timezone.now())
    response = retry(alice_api, ended, {"max_model_calls": 1000, "max_tokens": 10_000_000})
    assert response.status_code == 403, response.content
    body = response.json()
    assert body["code"] == "budget_over_cap"
    assert {f["field"] for f in body["fields"]} == {"body.budgets.max_model_calls", "body.budgets.max_tokens"}
    assert "WARDEN_MODEL_CALLS_CAP" in body["message"]
    assert Run.objects.filter(session=ended.session).count() == 1


def test_a_retry_within_the_caps_records_who_set_its_budgets(alice, alice_api):
    ended = RunFactory(session=SessionFactory(owner=alice), status="failed", phase="", wait_reason="",
                       error_code="internal_error", finished_at=timezone.now())
    response = retry(alice_api, ended, {"max_model_calls": 50})
    assert response.status_code == 201, response.content
    new = Run.objects.get(pk=response.json()["id"])
    assert (new.max_model_calls, new.budgets_set_by, new.retry_of_id) == (50, alice, ended.pk)


def test_only_the_permission_lets_a_retry_go_above_the_caps(alice, alice_api):
    grant(alice, ("runs_app", "exceed_budget_caps"))
    ended = RunFactory(session=SessionFactory(owner=alice), status="cancelled", phase="", wait_reason="",
                       finished_at=timezone.now())
    response = retry(alice_api, ended, {"max_model_calls": 1000})
    assert response.status_code == 201, response.content
    new = Run.objects.get(pk=response.json()["id"])
    assert (new.max_model_calls, new.budgets_set_by) == (1000, alice)
