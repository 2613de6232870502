"""Tool calls: the list (e.g. the unknown-outcome queue), and reconciliation by operators —
asking the downstream system again, or recording the outcome with evidence (SPEC §6)."""

import pytest
from pydantic import BaseModel

from approvals_app.models import AuditEntry
from runs_app.models import Run, RunStatus
from sessions_app.models import Message, MessageRole
from tests.support.api import Api, build_world, grant
from tests.support.factories import ApiKeyFactory, RunFactory, UserFactory
from tools_app import registry
from tools_app.models import Resolution, ToolCall, ToolCallStatus

pytestmark = pytest.mark.django_db


def listed(api, **params) -> list[str]:
    response = api.get("/tool-calls", params)
    assert response.status_code == 200, response.content
    return [item["id"] for item in response.json()["items"]]


@pytest.fixture
def reconciler():
    """An operator who may reconcile, and nothing else."""
    user = grant(UserFactory(username="reconciler"), ("tools_app", "reconcile_toolcall"))
    return Api(ApiKeyFactory(owner=user).secret)


def test_owner_lists_the_calls_of_their_runs_and_filters_by_status(world, alice_api, bob_api):
    mine = {str(pk) for pk in ToolCall.objects.filter(run__session__owner=world.run.session.owner).values_list("id", flat=True)}
    assert set(listed(alice_api)) == mine
    assert listed(alice_api, status="unknown") == [str(world.unknown_call.pk)]
    assert set(listed(alice_api, run=str(world.run.pk))) == {str(c.pk) for c in world.run.tool_calls.all()}
    assert listed(alice_api, tool="execute_refund", run=str(world.run.pk)) == [
        str(world.run.tool_calls.get(tool_name="execute_refund").pk)]
    assert listed(bob_api) == []


def test_the_reconcile_permission_opens_the_unknown_queue_of_all_runs_and_nothing_else(world, reconciler):
    assert listed(reconciler) == [str(world.unknown_call.pk)]
    read_call = world.run.tool_calls.get(tool_name="query_order")
    assert reconciler.get(f"/tool-calls/{read_call.pk}").status_code == 404
    assert reconciler.get(f"/tool-calls/{world.unknown_call.pk}").status_code == 200


def test_operator_records_an_applied_outcome_with_evidence_and_the_run_resumes(world, reconciler):
    response = reconciler.post(f"/tool-calls/{world.unknown_call.pk}/resolve",
                               {"applied": True, "evidence": "ledger entry L-77 under the key", "result": {"refund_id": "r-9"}})
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["resolution"], body["resolved_by"]) == ("succeeded", "applied", "reconciler")
    assert body["result"] == {"refund_id": "r-9"} and body["evidence"] == "ledger entry L-77 under the key"
    assert Run.objects.get(pk=world.unknown_run.pk).status == RunStatus.QUEUED
    assert Message.objects.filter(run=world.unknown_run, role=MessageRole.TOOL, tool_call_id=world.unknown_call.tool_call_id).exists()
    assert AuditEntry.objects.filter(action="reconcile", object_id=str(world.unknown_call.pk)).exists()
    # Still visible to the reconciler after it left the queue: it is theirs now.
    assert reconciler.get(f"/tool-calls/{world.unknown_call.pk}").status_code == 200


def test_not_applied_fails_the_call(world, operator_api):
    response = operator_api.post(f"/tool-calls/{world.unknown_call.pk}/resolve", {"applied": False, "evidence": "no such booking"})
    assert response.status_code == 200
    call = ToolCall.objects.get(pk=world.unknown_call.pk)
    assert (call.status, call.resolution, call.result) == (ToolCallStatus.FAILED, Resolution.NOT_APPLIED, None)


@pytest.mark.parametrize("payload,status,code", [
    ({"applied": True}, 422, "validation_error"),
    ({"applied": True, "evidence": ""}, 422, "validation_error"),
    ({"applied": True, "evidence": "   "}, 422, "evidence_required"),
    ({"applied": "perhaps", "evidence": "x"}, 422, "validation_error"),
    ({"applied": True, "evidence": "x", "result": [1, 2]}, 422, "validation_error"),
])
def test_resolving_needs_a_clear_outcome_and_evidence(world, operator_api, payload, status, code):
    response = operator_api.post(f"/tool-calls/{world.unknown_call.pk}/resolve", payload)
    assert (response.status_code, response.json()["code"]) == (status, code)
    assert ToolCall.objects.get(pk=world.unknown_call.pk).status == ToolCallStatus.UNKNOWN
    assert not AuditEntry.objects.exists()


def test_only_unknown_calls_can_be_resolved(world, operator_api):
    done = world.run.tool_calls.get(tool_name="execute_refund")
    response = operator_api.post(f"/tool-calls/{done.pk}/resolve", {"applied": False, "evidence": "x"})
    assert response.status_code == 409
    assert response.json()["code"] == "not_unknown"
    assert ToolCall.objects.get(pk=done.pk).status == ToolCallStatus.SUCCEEDED


def test_owner_sees_the_call_but_may_not_reconcile_it(world, alice_api):
    for path, body in (("resolve", {"applied": True, "evidence": "trust me"}), ("reconcile", None)):
        response = alice_api.post(f"/tool-calls/{world.unknown_call.pk}/{path}", body)
        assert response.status_code == 403
        assert response.json()["code"] == "not_permitted"
    assert ToolCall.objects.get(pk=world.unknown_call.pk).status == ToolCallStatus.UNKNOWN


class LedgerArgs(BaseModel):
    order_id: str


def _ledger_tool(verdict):
    return registry.Tool(
        name="ledger_transfer", description="test write", arguments=LedgerArgs, effect="write",
        execute=lambda context, args: {}, reconcile=lambda context, args: verdict,
    )


def test_asking_downstream_resolves_the_call_when_it_knows(world, reconciler, monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, "ledger_transfer", _ledger_tool(registry.Reconciled(applied=True, result={"ok": 1})))
    response = reconciler.post(f"/tool-calls/{world.unknown_call.pk}/reconcile")
    assert response.status_code == 200
    body = response.json()
    assert body["outcome"] == "resolved"
    assert (body["tool_call"]["status"], body["tool_call"]["resolution"]) == ("succeeded", "applied")
    assert body["tool_call"]["resolved_by"] is None  # the downstream system's answer, not a person's
    assert Run.objects.get(pk=world.unknown_run.pk).status == RunStatus.QUEUED


def test_asking_downstream_that_cannot_tell_yet_schedules_a_retry(world, reconciler, monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, "ledger_transfer", _ledger_tool(None))
    body = reconciler.post(f"/tool-calls/{world.unknown_call.pk}/reconcile").json()
    assert body["outcome"] == "unresolved"
    assert body["tool_call"]["status"] == "unknown"
    assert body["tool_call"]["next_attempt_at"] is not None


def test_a_tool_without_a_lookup_leaves_it_to_an_operator(world, reconciler):
    body = reconciler.post(f"/tool-calls/{world.unknown_call.pk}/reconcile").json()
    assert body["outcome"] == "manual"
    assert body["tool_call"]["status"] == "unknown"


def test_asking_downstream_about_a_settled_call_is_409(world, reconciler, operator_api):
    operator_api.post(f"/tool-calls/{world.unknown_call.pk}/resolve", {"applied": True, "evidence": "seen"})
    response = reconciler.post(f"/tool-calls/{world.unknown_call.pk}/reconcile")
    assert response.status_code == 409


@pytest.mark.parametrize("params", [{"status": "lost"}, {"tool": "bad name!"}, {"tool": "x" * 101}, {"run": "nope"}])
def test_bad_list_filters_are_422(alice_api, params):
    response = alice_api.get("/tool-calls", params)
    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"


def test_four_eyes_a_reconciler_may_not_settle_a_call_of_their_own_session(settings):
    """Issue 12, finding 6: an operator resolved an unknown refund in their own session."""
    user = grant(UserFactory(username="self-reconciler"), ("tools_app", "reconcile_toolcall"))
    own = build_world(user)
    api = Api(ApiKeyFactory(owner=user).secret)
    call_url = f"/tool-calls/{own.unknown_call.pk}"
    assert api.get(call_url).status_code == 200  # they see it: it is theirs
    for response in (api.post(f"{call_url}/resolve", {"applied": True, "evidence": "booked, trust me"}),
                     api.post(f"{call_url}/reconcile")):
        assert response.status_code == 403, response.content
        body = response.json()
        assert body["code"] == "not_permitted" and "Four eyes" in body["message"]
    assert ToolCall.objects.get(pk=own.unknown_call.pk).status == ToolCallStatus.UNKNOWN
    assert not AuditEntry.objects.exists()
    # Anyone else with the permission may; so may they once four eyes is switched off.
    settings.WARDEN_FOUR_EYES = False
    assert api.post(f"{call_url}/resolve", {"applied": False, "evidence": "ledger shows nothing"}).status_code == 200


def test_who_retried_a_run_may_not_record_the_outcome_of_its_write(world):
    """Four eyes counts whoever caused a write (SPEC §18): an operator who retried alice's run is a
    party to its write in doubt, and may neither resolve nor reconcile it; nothing is recorded."""
    retrier = grant(UserFactory(username="retrier", is_staff=True), ("tools_app", "reconcile_toolcall"),
                    ("runs_app", "change_run"))
    parent = RunFactory(session=world.unknown_run.session, status="cancelled", phase="", wait_reason="",
                        finished_at=world.unknown_run.created_at)
    Run.objects.filter(pk=world.unknown_run.pk).update(created_by=retrier, retry_of=parent)
    api = Api(ApiKeyFactory(owner=retrier).secret)
    for path, body in (("resolve", {"applied": True, "evidence": "ledger L-1"}), ("reconcile", None)):
        response = api.post(f"/tool-calls/{world.unknown_call.pk}/{path}", body)
        assert response.status_code == 403, response.content
        assert "you retried this run" in response.json()["message"]
    world.unknown_call.refresh_from_db()
    assert world.unknown_call.status == "unknown" and world.unknown_call.resolved_by_id is None
