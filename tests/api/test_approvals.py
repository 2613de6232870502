"""Approvals: the caller's queue (what they may decide) and the decision, recorded exactly once
by an authorized person through approval_decide (SPEC §7)."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals_app.models import Approval, ApprovalPolicy, ApprovalStatus, AuditEntry
from runs_app.models import Run, RunStatus
from tests.support.api import Api, build_world, grant
from tests.support.factories import ApiKeyFactory, UserFactory
from tools_app.models import ToolCallStatus

pytestmark = pytest.mark.django_db


def queue(api, **params) -> list[str]:
    response = api.get("/approvals", params)
    assert response.status_code == 200, response.content
    return [item["id"] for item in response.json()["items"]]


def test_the_default_queue_is_what_the_caller_may_decide(world, alice_api, operator_api, bob_api):
    assert queue(alice_api) == [str(world.user_approval.pk)]
    assert queue(operator_api) == [str(world.operator_approval.pk)]
    assert queue(bob_api) == []


def test_decidable_false_shows_everything_the_caller_may_see(world, alice_api):
    assert set(queue(alice_api, decidable="false")) == {str(world.user_approval.pk), str(world.operator_approval.pk)}
    items = alice_api.get("/approvals", {"decidable": "false"}).json()["items"]
    assert {item["policy"]: item["can_decide"] for item in items} == {"user": True, "operator": False}


def test_queue_is_oldest_first_and_pages(alice, alice_api):
    worlds = [build_world(alice) for _ in range(3)]
    expected = [str(w.user_approval.pk) for w in worlds]
    Approval.objects.filter(pk=worlds[0].user_approval.pk).update(requested_at=timezone.now() - timedelta(hours=2))
    first = alice_api.get("/approvals", {"limit": 2}).json()
    second = alice_api.get("/approvals", {"limit": 2, "cursor": first["next_cursor"]}).json()
    assert [i["id"] for i in first["items"] + second["items"]] == expected
    assert second["next_cursor"] is None


def test_status_filter_shows_history(world, alice, alice_api):
    alice_api.post(f"/approvals/{world.user_approval.pk}/decision", {"decision": "approve"})
    assert queue(alice_api) == []
    assert queue(alice_api, status="approved", decidable="false") == [str(world.user_approval.pk)]


def test_four_eyes_an_operator_cannot_decide_operator_approvals_of_their_own_session(api_operator, operator_api):
    own = build_world(api_operator)
    assert str(own.operator_approval.pk) not in queue(operator_api)
    response = operator_api.post(f"/approvals/{own.operator_approval.pk}/decision", {"decision": "approve"})
    assert response.status_code == 403
    assert Approval.objects.get(pk=own.operator_approval.pk).status == ApprovalStatus.PENDING


def test_owner_approves_a_user_level_confirmation_and_the_run_resumes(world, alice, alice_api):
    response = alice_api.post(f"/approvals/{world.user_approval.pk}/decision", {"decision": "approve", "note": "yes, refund"})
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["decided_by"], body["note"], body["can_decide"]) == ("approved", "alice", "yes, refund", False)
    run = Run.objects.get(pk=world.approval_run.pk)
    assert run.status == RunStatus.QUEUED  # the same run resumes; never a new one
    assert AuditEntry.objects.filter(action="approve", actor=alice, object_id=str(world.user_approval.pk)).exists()


def test_operator_rejects_and_the_tool_call_is_cancelled(world, api_operator, operator_api):
    response = operator_api.post(f"/approvals/{world.operator_approval.pk}/decision", {"decision": "reject", "note": "not eligible"})
    assert response.status_code == 200
    approval = Approval.objects.get(pk=world.operator_approval.pk)
    assert (approval.status, approval.decided_by, approval.note) == (ApprovalStatus.REJECTED, api_operator, "not eligible")
    assert approval.tool_call.status == ToolCallStatus.CANCELLED
    assert Run.objects.get(pk=world.operator_run.pk).status == RunStatus.QUEUED


def test_a_second_decision_is_409_naming_the_first_and_changes_nothing(world, alice_api):
    assert alice_api.post(f"/approvals/{world.user_approval.pk}/decision", {"decision": "approve"}).status_code == 200
    before = Approval.objects.values().get(pk=world.user_approval.pk)
    audits = AuditEntry.objects.count()
    response = alice_api.post(f"/approvals/{world.user_approval.pk}/decision", {"decision": "reject"})
    assert response.status_code == 409
    assert response.json()["code"] == "already_decided"
    assert "alice" in response.json()["message"]
    assert Approval.objects.values().get(pk=world.user_approval.pk) == before
    assert AuditEntry.objects.count() == audits


def test_an_approval_past_its_expiry_cannot_be_decided(world, alice_api):
    Approval.objects.filter(pk=world.user_approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = alice_api.post(f"/approvals/{world.user_approval.pk}/decision", {"decision": "approve"})
    assert response.status_code == 409
    assert response.json()["code"] == "expired"
    assert Approval.objects.get(pk=world.user_approval.pk).status == ApprovalStatus.PENDING


def test_seeing_is_not_deciding(world, alice_api, operator_api):
    # alice sees the operator approval of her own run but may not decide it; the operator
    # sees her user-level confirmation but it is hers to give.
    for api, approval in ((alice_api, world.operator_approval), (operator_api, world.user_approval)):
        assert api.get(f"/approvals/{approval.pk}").status_code == 200
        response = api.post(f"/approvals/{approval.pk}/decision", {"decision": "approve"})
        assert response.status_code == 403
        assert response.json()["code"] == "not_permitted"
        assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING


def test_a_decider_without_view_run_sees_only_operator_approvals(world):
    approver = grant(UserFactory(username="approver"), ("approvals_app", "decide_approval"))
    api = Api(ApiKeyFactory(owner=approver).secret)
    assert queue(api, decidable="false") == [str(world.operator_approval.pk)]
    assert api.get(f"/approvals/{world.user_approval.pk}").status_code == 404
    assert api.post(f"/approvals/{world.operator_approval.pk}/decision", {"decision": "approve"}).status_code == 200


@pytest.mark.parametrize("payload,field", [
    ({}, "body.decision"),
    ({"decision": "maybe"}, "body.decision"),
    ({"decision": "approve", "note": "x" * 2001}, "body.note"),
])
def test_invalid_decisions_are_422_and_change_nothing(world, alice_api, payload, field):
    response = alice_api.post(f"/approvals/{world.user_approval.pk}/decision", payload)
    assert response.status_code == 422
    assert field in [f["field"] for f in response.json()["fields"]]
    assert Approval.objects.get(pk=world.user_approval.pk).status == ApprovalStatus.PENDING


def test_approval_detail_carries_the_tool_call(world, alice_api):
    body = alice_api.get(f"/approvals/{world.user_approval.pk}").json()
    assert body["tool_call"]["tool_name"] == "execute_refund"
    assert body["tool_call"]["arguments"] == {"order_id": "9527", "amount": "10.00"}
    assert body["policy"] == ApprovalPolicy.USER and body["run_id"] == str(world.approval_run.pk)
    assert body["session_id"] == str(world.approval_run.session_id)


def test_the_customer_sees_the_message_meant_for_them_never_the_operators_note(world, alice_api, operator_api):
    response = operator_api.post(f"/approvals/{world.operator_approval.pk}/decision", {
        "decision": "reject", "note": "suspected fraud ring, ticket 77", "customer_message": "Please call our support line.",
    })
    assert response.status_code == 200
    assert (response.json()["note"], response.json()["customer_message"]) == (
        "suspected fraud ring, ticket 77", "Please call our support line.")  # the operator's own view
    as_customer = alice_api.get(f"/approvals/{world.operator_approval.pk}").json()
    assert (as_customer["note"], as_customer["customer_message"]) == ("", "Please call our support line.")
    events = alice_api.get(f"/runs/{world.operator_run.pk}/events").json()["items"]
    decided = next(e for e in events if e["type"] == "approval_decided")
    assert decided["payload"]["note"] == "" and decided["payload"]["customer_message"] == "Please call our support line."
    detail = alice_api.get(f"/runs/{world.operator_run.pk}").json()
    assert "ticket 77" not in json.dumps(detail) and "ticket 77" not in json.dumps(events)
    operator_events = operator_api.get(f"/runs/{world.operator_run.pk}/events").json()["items"]
    assert any(e["payload"].get("note") == "suspected fraud ring, ticket 77" for e in operator_events)


def test_a_message_for_the_customer_is_bounded(world, operator_api):
    response = operator_api.post(f"/approvals/{world.operator_approval.pk}/decision",
                                 {"decision": "reject", "note": "n", "customer_message": "x" * 301})
    assert response.status_code == 422
    assert Approval.objects.get(pk=world.operator_approval.pk).status == ApprovalStatus.PENDING


def test_the_customer_reads_a_role_where_the_desk_reads_an_operators_name(world, alice_api):
    """Issue 27, finding 8: an operator's username never reaches the session's customer — not in the
    approval (`decided_by`, `approved_by`) nor in the run's events (`decided_by`, `approved_by`);
    the operator who decided still reads it."""
    oliver = grant(UserFactory(username="oliver-on-shift", is_staff=True), ("approvals_app", "decide_approval"),
                   ("runs_app", "view_run"))
    operator_api = Api(ApiKeyFactory(owner=oliver).secret)
    approval = world.operator_approval
    assert operator_api.post(f"/approvals/{approval.pk}/decision", {"decision": "approve"}).status_code == 200
    operator_name = Approval.objects.get(pk=approval.pk).decided_by.get_username()
    seen = alice_api.get(f"/approvals/{approval.pk}").json()
    assert (seen["decided_by"], seen["approved_by"]) == ("operator", ["operator"])
    assert operator_api.get(f"/approvals/{approval.pk}").json()["decided_by"] == operator_name
    events = alice_api.get(f"/runs/{approval.run_id}/events").json()["items"]
    (decided,) = [e for e in events if e["type"] == "approval_decided"]
    assert decided["payload"]["decided_by"] == "operator" and decided["payload"]["approved_by"] == ["operator"]
    assert operator_name not in json.dumps(events)
    desk_events = operator_api.get(f"/runs/{approval.run_id}/events").json()["items"]
    assert [e for e in desk_events if e["type"] == "approval_decided"][0]["payload"]["decided_by"] == operator_name
