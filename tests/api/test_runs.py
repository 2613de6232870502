"""Runs: the filtered, keyset-paginated list; the detail with steps, tool calls, approvals and
applied side effects; the event log; cancellation (requested is not done, SPEC §9)."""

import json
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals_app.models import ApprovalStatus, AuditEntry
from runs_app.models import Run, RunStatus
from tests.support.api import grant
from tests.support.factories import RunFactory, SessionFactory, ToolCallFactory, UserFactory
from tools_app.models import ToolCallStatus, ToolEffect

pytestmark = pytest.mark.django_db


def make_runs(owner):
    """One run in every shape, each in its own session (one active run per session)."""
    def run(**fields):
        return RunFactory(session=SessionFactory(owner=owner), **fields)

    now = timezone.now()
    return {
        "queued": run(),
        "running": run(status=RunStatus.RUNNING, phase="calling_model", lease_owner="w1",
                       lease_expires_at=now + timedelta(seconds=30), started_at=now),
        "waiting_approval": run(status=RunStatus.WAITING, phase="", wait_reason="approval"),
        "waiting_input": run(status=RunStatus.WAITING, phase="", wait_reason="waiting_input"),
        "completed": run(status=RunStatus.COMPLETED, phase="", finished_at=now),
        "failed": run(status=RunStatus.FAILED, phase="", finished_at=now, error_code="budget_tokens",
                      error_detail="200000 tokens used"),
    }


def listed(api, **params) -> list[str]:
    response = api.get("/runs", params)
    assert response.status_code == 200, response.content
    return [item["id"] for item in response.json()["items"]]


def ids(*runs) -> set[str]:
    return {str(r.pk) for r in runs}


@pytest.mark.parametrize("params,expected", [
    ({}, ["queued", "running", "waiting_approval", "waiting_input", "completed", "failed"]),
    ({"status": "waiting"}, ["waiting_approval", "waiting_input"]),
    ({"status": ["completed", "failed"]}, ["completed", "failed"]),
    ({"phase": "calling_model"}, ["running"]),
    ({"phase": "waiting_worker"}, ["queued"]),
    ({"wait_reason": "approval"}, ["waiting_approval"]),
    ({"wait_reason": "approval", "status": "running"}, []),
    ({"status": "cancelled"}, []),
])
def test_list_filters(alice, alice_api, params, expected):
    runs = make_runs(alice)
    make_runs(UserFactory())  # someone else's, never listed
    assert set(listed(alice_api, **params)) == ids(*[runs[name] for name in expected])


def test_list_filters_by_session_and_creation_time(alice, alice_api):
    runs = make_runs(alice)
    day = timedelta(days=1)
    Run.objects.filter(pk=runs["completed"].pk).update(created_at=timezone.now() - 3 * day)
    Run.objects.filter(pk=runs["failed"].pk).update(created_at=timezone.now() - 10 * day)
    assert listed(alice_api, session=str(runs["failed"].session_id)) == [str(runs["failed"].pk)]
    window = {"created_after": (timezone.now() - 5 * day).isoformat(), "created_before": (timezone.now() - day).isoformat()}
    assert listed(alice_api, **window) == [str(runs["completed"].pk)]
    # Without an offset a timestamp means UTC.
    naive = (timezone.now() - 5 * day).replace(tzinfo=None).isoformat()
    assert str(runs["failed"].pk) not in listed(alice_api, created_after=naive)


def test_list_is_newest_first_and_keyset_pages_cover_everything_once(alice, alice_api):
    session_runs = [RunFactory(session=SessionFactory(owner=alice), status=RunStatus.COMPLETED, phase="",
                               finished_at=timezone.now()) for _ in range(9)]
    same_moment = timezone.now() - timedelta(hours=1)
    Run.objects.filter(pk__in=[r.pk for r in session_runs[:5]]).update(created_at=same_moment)
    expected = list(Run.objects.filter(session__owner=alice).order_by("-created_at", "-id").values_list("id", flat=True))
    seen, cursor = [], None
    while True:
        body = alice_api.get("/runs", {"limit": 4, **({"cursor": cursor} if cursor else {})}).json()
        seen += [item["id"] for item in body["items"]]
        cursor = body["next_cursor"]
        if not cursor:
            break
    assert seen == [str(pk) for pk in expected]


def test_list_item_shape(alice, alice_api):
    runs = make_runs(alice)
    items = {item["id"]: item for item in alice_api.get("/runs").json()["items"]}
    failed = items[str(runs["failed"].pk)]
    assert (failed["status"], failed["phase"], failed["wait_reason"], failed["error_code"]) == (
        "failed", None, None, "budget_tokens")
    waiting = items[str(runs["waiting_approval"].pk)]
    assert (waiting["phase"], waiting["wait_reason"]) == (None, "approval")


def test_list_items_carry_the_money_their_applied_writes_moved_per_currency(alice, alice_api):
    """What the desk shows as the run's applied effects, summed per currency its tool declares
    (execute_refund: USD); a write that did not take effect, or was answered by an earlier identical
    call, moved nothing."""
    run, other, quiet = (RunFactory(session=SessionFactory(owner=alice), status=RunStatus.COMPLETED, phase="",
                                    finished_at=timezone.now())
                         for _ in range(3))

    def write(run, tool_name, arguments, **fields):
        return ToolCallFactory(step__run=run, run=run, tool_name=tool_name, effect=ToolEffect.WRITE, arguments=arguments,
                               finished_at=timezone.now(), idempotency_key=f"refund:{uuid.uuid4()}",
                               **{"status": ToolCallStatus.SUCCEEDED, **fields})

    first = write(run, "execute_refund", {"order_id": "9527", "amount": "9.00"})
    write(run, "execute_refund", {"order_id": "9528", "amount": "1.50"})
    write(run, "execute_refund", {"order_id": "9529", "amount": "100.00"}, status=ToolCallStatus.FAILED)
    write(run, "execute_refund", {"order_id": "9527", "amount": "9.00"}, reused_from=first)
    write(other, "execute_refund", {"order_id": "9530", "amount": "20.00"}, status=ToolCallStatus.UNKNOWN)
    ToolCallFactory(step__run=quiet, run=quiet, status=ToolCallStatus.SUCCEEDED, finished_at=timezone.now())  # a read

    items = {item["id"]: item for item in alice_api.get("/runs").json()["items"]}
    assert items[str(run.pk)]["money_moved"] == [{"amount": "10.50", "currency": "USD"}]
    assert items[str(other.pk)]["money_moved"] == []
    assert items[str(quiet.pk)]["money_moved"] == []


def test_operators_list_every_run_through_view_run(alice, bob, bob_api):
    runs = make_runs(alice)
    assert not set(listed(bob_api)) & ids(*runs.values())
    grant(bob, ("runs_app", "view_run"))
    assert ids(*runs.values()) <= set(listed(bob_api))


def test_group_permissions_count_too(alice, bob, bob_api):
    from django.contrib.auth.models import Group, Permission

    runs = make_runs(alice)
    group = Group.objects.create(name="desk")
    group.permissions.add(Permission.objects.get(codename="view_run"))
    bob.groups.add(group)
    assert ids(*runs.values()) <= set(listed(bob_api))


# --- detail --------------------------------------------------------------------------------

def test_detail_shows_steps_tool_calls_approvals_effects_and_budgets(world, alice_api):
    body = alice_api.get(f"/runs/{world.run.pk}").json()
    assert body["status"] == "completed"
    assert [s["index"] for s in body["steps"]] == [0]
    assert body["steps"][0]["text"] == "Let me check."
    assert [(c["tool_name"], c["effect"], c["status"]) for c in body["tool_calls"]] == [
        ("query_order", "read", "succeeded"), ("execute_refund", "write", "succeeded")]
    assert [e["tool"] for e in body["applied_effects"]] == ["execute_refund"]
    assert body["applied_effects"][0]["idempotency_key"] == f"refund:{world.run.pk}"
    assert body["budgets"]["max_model_calls"] == 10 and body["budgets"]["max_tokens"] == 100_000
    assert body["wait"] is None and body["cancel"] is None and body["error"] is None
    assert body["can_cancel"] is False
    assert [e["seq"] for e in body["recent_events"]] == [1, 2, 3, 4] and body["event_seq"] == 4


def test_detail_of_a_waiting_run_shows_its_approval_and_wait(world, alice_api):
    body = alice_api.get(f"/runs/{world.approval_run.pk}").json()
    assert body["wait"]["reason"] == "approval"
    assert [(a["policy"], a["status"], a["can_decide"]) for a in body["approvals"]] == [("user", "pending", True)]
    assert body["tool_calls"][0]["approval_id"] == str(world.user_approval.pk)
    assert body["can_cancel"] is True


def test_detail_of_a_failed_run_has_its_error(alice, alice_api):
    failed = make_runs(alice)["failed"]
    assert alice_api.get(f"/runs/{failed.pk}").json()["error"] == {"code": "budget_tokens", "detail": "200000 tokens used"}


def test_detail_of_someone_elses_run_is_404(world, bob_api):
    response = bob_api.get(f"/runs/{world.run.pk}")
    assert response.status_code == 404
    assert response.json() == {"code": "not_found", "message": "No such run."}


# --- events --------------------------------------------------------------------------------

def test_events_after_a_sequence_number(world, alice_api):
    body = alice_api.get(f"/runs/{world.run.pk}/events", {"after": 2}).json()
    assert [e["seq"] for e in body["items"]] == [3, 4]
    assert (body["next_after"], body["run_status"], body["finished"]) == (4, "completed", True)
    page = alice_api.get(f"/runs/{world.run.pk}/events", {"limit": 1}).json()
    assert [e["seq"] for e in page["items"]] == [1] and page["finished"] is False


def test_events_of_a_live_run_are_never_finished(world, alice_api):
    body = alice_api.get(f"/runs/{world.approval_run.pk}/events", {"after": 99}).json()
    assert body == {"items": [], "next_after": 99, "run_status": "waiting", "finished": False}


# --- cancel --------------------------------------------------------------------------------

def test_cancelling_a_waiting_run_finishes_it_and_withdraws_its_approval(alice, world, alice_api):
    response = alice_api.post(f"/runs/{world.approval_run.pk}/cancel", {"reason": "changed my mind"})
    assert response.status_code == 202
    assert response.json()["status"] == "cancelled"
    world.approval_run.refresh_from_db()
    assert (world.approval_run.cancel_requested_by, world.approval_run.cancel_reason) == (alice, "changed my mind")
    world.user_approval.refresh_from_db()
    assert world.user_approval.status == ApprovalStatus.WITHDRAWN
    assert world.user_approval.tool_call.status == ToolCallStatus.CANCELLED
    assert AuditEntry.objects.filter(action="cancel", actor=alice, object_id=str(world.approval_run.pk)).exists()
    detail = alice_api.get(f"/runs/{world.approval_run.pk}").json()
    assert detail["cancel"]["requested_by"] == "alice" and detail["cancel"]["reason"] == "changed my mind"


def test_cancelling_a_running_run_only_records_the_request(alice, alice_api):
    running = make_runs(alice)["running"]
    response = alice_api.post(f"/runs/{running.pk}/cancel")
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "running" and body["cancel_requested_at"] is not None
    running.refresh_from_db()
    assert running.status == RunStatus.RUNNING and running.cancel_requested_at is not None


def test_cancelling_a_terminal_run_is_409_and_changes_nothing(world, alice_api):
    before = Run.objects.values().get(pk=world.run.pk)
    response = alice_api.post(f"/runs/{world.run.pk}/cancel", {"reason": "too late"})
    assert response.status_code == 409
    assert response.json()["code"] == "run_terminal"
    assert Run.objects.values().get(pk=world.run.pk) == before
    assert not AuditEntry.objects.filter(action="cancel").exists()


def test_operators_cancel_with_change_run_not_with_view_run(alice, world, bob, bob_api):
    grant(bob, ("runs_app", "view_run"))
    response = bob_api.post(f"/runs/{world.unknown_run.pk}/cancel")
    assert response.status_code == 403
    assert response.json()["code"] == "not_permitted"
    assert Run.objects.get(pk=world.unknown_run.pk).cancel_requested_at is None
    grant(bob, ("runs_app", "change_run"))
    assert bob_api.post(f"/runs/{world.unknown_run.pk}/cancel", {"reason": "runaway"}).status_code == 202
    unknown_run = Run.objects.get(pk=world.unknown_run.pk)
    # A write with an unknown outcome is in flight: the run waits for reconciliation first.
    assert (unknown_run.status, unknown_run.cancel_requested_by) == (RunStatus.WAITING, bob)


def test_cancel_reason_is_validated(world, alice_api):
    response = alice_api.post(f"/runs/{world.approval_run.pk}/cancel", {"reason": "x" * 301})
    assert response.status_code == 422
    assert response.json()["fields"][0]["field"] == "body.reason"
    assert Run.objects.get(pk=world.approval_run.pk).cancel_requested_at is None



def test_outcome_is_beside_the_status_and_filters_the_list(alice, alice_api):
    now = timezone.now()

    def ended(outcome, status=RunStatus.COMPLETED):
        return RunFactory(session=SessionFactory(owner=alice), status=status, phase="", finished_at=now, outcome=outcome)

    applied, rejected, expired, not_applied, nothing = (
        ended("applied"), ended("rejected"), ended("expired"), ended("not_applied", RunStatus.CANCELLED), ended("none"))
    active = RunFactory(session=SessionFactory(owner=alice))
    items = {item["id"]: item["outcome"] for item in alice_api.get("/runs").json()["items"]}
    assert items[str(rejected.pk)] == "rejected" and items[str(active.pk)] is None
    assert alice_api.get(f"/runs/{applied.pk}").json()["outcome"] == "applied"
    did_not_happen = listed(alice_api, outcome=["not_applied", "rejected", "expired"])
    assert set(did_not_happen) == ids(rejected, expired, not_applied)
    assert set(listed(alice_api, outcome="none")) == ids(nothing)
    assert alice_api.get("/runs", {"outcome": "maybe"}).status_code == 422


def test_the_schema_documents_the_outcome(alice_api):
    schema = alice_api.get("/openapi.json").json()
    run_out = schema["components"]["schemas"]["RunOut"]["properties"]["outcome"]
    assert "rejected" in json.dumps(run_out) and "applied" in json.dumps(run_out)
    parameters = {p["name"] for p in schema["paths"]["/api/v1/runs"]["get"]["parameters"]}
    assert "outcome" in parameters
