"""The unknown-calls queue (SPEC §6, §13): ask the downstream system now, or record the
outcome with evidence — through the reconciliation services, permission-checked and audited."""

import dataclasses
import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from approvals_app.models import AuditEntry
from runs_app.models import Run, RunStatus, WaitReason
from sessions_app.models import Message, MessageRole
from tests.support.desk import csrf_client, csrf_token_of, messages_of
from tools_app import registry
from tools_app.models import Resolution, ToolCall, ToolCallStatus
from config.errors import WardenError
from engine.actions.reconciliation import tool_call_reconcile_auto, tool_call_resolve
from tools_app.registry import Reconciled

pytestmark = pytest.mark.django_db

QUEUE = reverse("admin:tools_app_unknowntoolcall_changelist")
BOOKED = {"refund_id": "rf_0001", "order_id": "9527", "amount": "25.00", "currency": "USD"}


def resolve_url(call) -> str:
    return reverse("admin:tools_app_unknowntoolcall_resolve", args=[call.pk])


@pytest.fixture
def downstream(monkeypatch):
    """The refund tool's lookup by idempotency key answers what the test says."""
    answers: dict[str, Reconciled | None] = {}
    asked: list[str] = []

    def lookup(ctx, args):
        asked.append(ctx.idempotency_key)
        return answers.get(ctx.idempotency_key)

    refund_tool = registry.tool_get("execute_refund")
    monkeypatch.setitem(registry._REGISTRY, "execute_refund", dataclasses.replace(refund_tool, reconcile=lookup))
    return answers, asked


def test_queue_lists_only_unknown_calls_oldest_first(reconciler, make_unknown_refund, pending_refund):
    """Oldest first by how long the outcome has been unknown (since the call gave up waiting)."""
    newer, older = make_unknown_refund(), make_unknown_refund()
    ToolCall.objects.filter(pk=older.refund.pk).update(finished_at=timezone.now() - timedelta(hours=3))
    response = csrf_client(reconciler).get(QUEUE)
    assert [c.pk for c in response.context["cl"].result_list] == [older.refund.pk, newer.refund.pk]
    assert str(pending_refund.refund.pk)[:8] not in response.content.decode()


def test_query_downstream_now_resolves_a_booked_refund_and_resumes_the_run(reconciler, unknown_refund, downstream):
    answers, asked = downstream
    call = unknown_refund.refund
    answers[call.idempotency_key] = Reconciled(applied=True, result=BOOKED, detail="refund found by idempotency key")
    client = csrf_client(reconciler)
    page = client.get(QUEUE)
    response = client.post(
        QUEUE, {"action": "query_downstream_now", "_selected_action": [call.pk], "csrfmiddlewaretoken": csrf_token_of(page)},
        follow=True,
    )
    assert asked == [call.idempotency_key]
    assert any("applied" in m and "succeeded" in m for m in messages_of(response)), messages_of(response)
    call.refresh_from_db()
    assert call.status == ToolCallStatus.SUCCEEDED and call.result == BOOKED and call.resolution == Resolution.APPLIED
    assert Run.objects.get(pk=unknown_refund.run.pk).status == RunStatus.QUEUED


def test_query_downstream_now_from_the_call_page_when_the_downstream_cannot_tell(reconciler, unknown_refund, downstream):
    call = unknown_refund.refund
    client = csrf_client(reconciler)
    page = client.get(reverse("admin:tools_app_unknowntoolcall_change", args=[call.pk]))
    assert 'id="query-downstream"' in page.content.decode() and 'id="record-outcome"' in page.content.decode()
    query = reverse("admin:tools_app_unknowntoolcall_query", args=[call.pk])
    response = client.post(query, {"csrfmiddlewaretoken": csrf_token_of(page)}, follow=True)
    assert any("could not tell yet" in m for m in messages_of(response)), messages_of(response)
    call.refresh_from_db()
    assert call.status == ToolCallStatus.UNKNOWN and call.reconcile_attempts == 1
    assert Run.objects.get(pk=unknown_refund.run.pk).wait_reason == WaitReason.RECONCILIATION


def test_operator_records_an_applied_refund_with_evidence(reconciler, unknown_refund):
    call = unknown_refund.refund
    client = csrf_client(reconciler)
    page = client.get(resolve_url(call))
    response = client.post(resolve_url(call), {
        "outcome": "applied", "evidence": "gateway statement line 2026-11-29 rf_0001",
        "result": json.dumps(BOOKED), "csrfmiddlewaretoken": csrf_token_of(page),
    }, follow=True)
    assert response.redirect_chain[-1][0] == QUEUE
    assert any(m.startswith("Recorded: execute_refund was applied") for m in messages_of(response)), messages_of(response)
    call.refresh_from_db()
    assert (call.status, call.resolution, call.resolved_by, call.result) == (
        ToolCallStatus.SUCCEEDED, Resolution.APPLIED, reconciler, BOOKED
    )
    assert call.evidence == "gateway statement line 2026-11-29 rf_0001"
    entry = AuditEntry.objects.get(object_id=str(call.pk))
    assert (entry.actor, entry.action, entry.run_id) == (reconciler, "reconcile", unknown_refund.run.pk)
    assert entry.before == {"status": "unknown"} and entry.after == {"status": "succeeded", "resolution": "applied"}
    assert entry.note == call.evidence
    # The model is told the outcome, and the run resumes.
    told = Message.objects.get(session=unknown_refund.run.session, role=MessageRole.TOOL, tool_call_id="call_r")
    assert json.loads(told.content) == BOOKED
    assert Run.objects.get(pk=unknown_refund.run.pk).status == RunStatus.QUEUED


def test_operator_records_a_refund_that_was_not_applied(reconciler, unknown_refund):
    call = unknown_refund.refund
    client = csrf_client(reconciler)
    page = client.get(resolve_url(call))
    client.post(resolve_url(call), {
        "outcome": "not_applied", "evidence": "gateway support: no refund under this key",
        "csrfmiddlewaretoken": csrf_token_of(page),
    })
    call.refresh_from_db()
    assert (call.status, call.resolution, call.result) == (ToolCallStatus.FAILED, Resolution.NOT_APPLIED, None)
    assert AuditEntry.objects.get(object_id=str(call.pk)).after == {"status": "failed", "resolution": "not_applied"}


@pytest.mark.parametrize(
    "form, error",
    [
        ({"outcome": "applied", "evidence": ""}, "This field is required"),
        ({"outcome": "applied", "evidence": "   "}, "This field is required"),
        ({"outcome": "applied", "evidence": "statement", "result": "{not json"}, "Not valid JSON"),
        ({"outcome": "applied", "evidence": "statement", "result": "[1, 2]"}, "must be a JSON object"),
        ({"outcome": "not_applied", "evidence": "statement", "result": '{"refund_id": "x"}'}, "not applied has no result"),
        ({"outcome": "applied", "evidence": "statement", "result": '{"amount": NaN}'}, "NaN is not a JSON value"),
        ({"outcome": "applied", "evidence": "statement", "result": '{"refund_id": "a\\u0000b"}'}, "must not contain NUL"),
    ],
    ids=["no-evidence", "blank-evidence", "bad-json", "not-an-object", "result-for-not-applied", "nan", "nul"],
)
def test_the_outcome_form_requires_evidence_and_a_valid_result(reconciler, unknown_refund, form, error):
    call = unknown_refund.refund
    client = csrf_client(reconciler)
    page = client.get(resolve_url(call))
    response = client.post(resolve_url(call), {**form, "csrfmiddlewaretoken": csrf_token_of(page)})
    assert response.status_code == 400 and error in response.content.decode()
    call.refresh_from_db()
    assert call.status == ToolCallStatus.UNKNOWN
    assert not AuditEntry.objects.exists()


def test_the_service_itself_requires_evidence(reconciler, unknown_refund):
    with pytest.raises(WardenError) as refused:
        tool_call_resolve(tool_call=unknown_refund.refund, applied=True, evidence="  ", acting_user=reconciler)
    assert refused.value.code == "evidence_required"


def test_staff_without_the_permission_cannot_reconcile(viewer, unknown_refund, downstream):
    answers, asked = downstream
    call = unknown_refund.refund
    client = csrf_client(viewer)
    page = client.get(reverse("admin:tools_app_unknowntoolcall_change", args=[call.pk]))
    assert page.status_code == 200
    body = page.content.decode()
    assert 'id="record-outcome"' not in body and 'id="query-downstream"' not in body
    token = csrf_token_of(page)
    assert client.get(resolve_url(call)).status_code == 403
    response = client.post(resolve_url(call), {"outcome": "applied", "evidence": "trust me", "csrfmiddlewaretoken": token})
    assert response.status_code == 403
    query = reverse("admin:tools_app_unknowntoolcall_query", args=[call.pk])
    assert client.post(query, {"csrfmiddlewaretoken": token}).status_code == 403
    # The bulk action is not offered, and posting it anyway does nothing.
    assert "query_downstream_now" not in client.get(QUEUE).content.decode()
    client.post(QUEUE, {"action": "query_downstream_now", "_selected_action": [call.pk], "csrfmiddlewaretoken": token})
    assert asked == []
    call.refresh_from_db()
    assert call.status == ToolCallStatus.UNKNOWN and not AuditEntry.objects.exists()
    # The service refuses on its own, whatever the interface.
    with pytest.raises(WardenError) as refused:
        tool_call_resolve(tool_call=call, applied=True, evidence="trust me", acting_user=viewer)
    assert refused.value.code == "not_permitted"


def test_four_eyes_a_reconciler_may_not_settle_a_call_of_their_own_session(reconciler, own_unknown_refund, downstream, settings):
    answers, asked = downstream
    call = own_unknown_refund.refund
    answers[call.idempotency_key] = Reconciled(applied=True, result=BOOKED, detail="refund found by idempotency key")
    client = csrf_client(reconciler)
    page = client.get(reverse("admin:tools_app_unknowntoolcall_change", args=[call.pk]))
    body = page.content.decode()
    # No buttons; the reason instead.
    assert 'id="record-outcome"' not in body and 'id="query-downstream"' not in body
    assert 'id="reconcile-barred"' in body and "Four eyes" in body
    queue = client.get(QUEUE).content.decode()
    assert resolve_url(call) not in queue and "Four eyes" in queue
    token = csrf_token_of(page)
    barred = client.get(resolve_url(call))
    assert barred.status_code == 403 and 'id="resolve-form"' not in barred.content.decode()
    assert any("Four eyes" in m for m in messages_of(barred)), messages_of(barred)
    response = client.post(resolve_url(call), {"outcome": "applied", "evidence": "it is mine", "csrfmiddlewaretoken": token})
    assert response.status_code == 403
    query = reverse("admin:tools_app_unknowntoolcall_query", args=[call.pk])
    queried = client.post(query, {"csrfmiddlewaretoken": token}, follow=True)
    assert any("Four eyes" in m for m in messages_of(queried)), messages_of(queried)
    bulk = client.post(QUEUE, {"action": "query_downstream_now", "_selected_action": [call.pk], "csrfmiddlewaretoken": token},
                       follow=True)
    assert any("Four eyes" in m for m in messages_of(bulk)), messages_of(bulk)
    assert asked == []
    call.refresh_from_db()
    assert call.status == ToolCallStatus.UNKNOWN and not AuditEntry.objects.exists()
    # The actions refuse on their own, whatever the interface.
    for attempt in (lambda: tool_call_resolve(tool_call=call, applied=True, evidence="mine", acting_user=reconciler),
                    lambda: tool_call_reconcile_auto(tool_call=call, acting_user=reconciler)):
        with pytest.raises(WardenError) as refused:
            attempt()
        assert refused.value.code == "not_permitted" and "Four eyes" in refused.value.message
    # With four eyes switched off (WARDEN_FOUR_EYES=0) the same operator may.
    settings.WARDEN_FOUR_EYES = False
    page = client.get(resolve_url(call))
    assert page.status_code == 200
    client.post(resolve_url(call), {"outcome": "not_applied", "evidence": "ledger shows nothing", "csrfmiddlewaretoken": csrf_token_of(page)})
    assert ToolCall.objects.get(pk=call.pk).status == ToolCallStatus.FAILED


def test_a_call_resolved_meanwhile_is_reported_not_resolved_twice(reconciler, unknown_refund):
    call = unknown_refund.refund
    client = csrf_client(reconciler)
    page = client.get(resolve_url(call))
    tool_call_resolve(tool_call=call, applied=True, evidence="automatic lookup", acting_user=None, result=BOOKED)
    response = client.post(
        resolve_url(call), {"outcome": "not_applied", "evidence": "late", "csrfmiddlewaretoken": csrf_token_of(page)},
        follow=True,
    )
    assert any("succeeded, not unknown" in m for m in messages_of(response)), messages_of(response)
    call.refresh_from_db()
    assert call.status == ToolCallStatus.SUCCEEDED and call.resolved_by is None


def test_queue_renders_at_a_constant_query_count(reconciler, make_unknown_refund):
    client = csrf_client(reconciler)
    make_unknown_refund()
    client.get(QUEUE)
    with CaptureQueriesContext(connection) as few:
        assert client.get(QUEUE).status_code == 200
    for _ in range(4):
        make_unknown_refund()
    with CaptureQueriesContext(connection) as many:
        assert client.get(QUEUE).status_code == 200
    assert len(many) == len(few)
