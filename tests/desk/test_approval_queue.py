"""The approval queue in the admin (SPEC §7, §13): what an operator sees, and approving or
rejecting over HTTP, logged in, with CSRF — only through approval_decide."""

import json
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from approvals_app.models import Approval, ApprovalStatus, AuditEntry
from approvals_app.errors import ApprovalRefusal
from config.errors import WardenError
from engine.actions.approvals import approval_decide
from runs_app.models import Run, RunEvent, RunStatus
from sessions_app.models import Message, MessageRole
from tests.support.desk import csrf_client, csrf_token_of, messages_of
from tests.support.factories import ApprovalFactory, SessionFactory
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = pytest.mark.django_db

QUEUE = reverse("admin:approvals_app_approval_changelist")


def approve_url(approval) -> str:
    return reverse("admin:approvals_app_approval_approve", args=[approval.pk])


def reject_url(approval) -> str:
    return reverse("admin:approvals_app_approval_reject", args=[approval.pk])


def decide_over_http(client, url: str, note: str):
    """What a browser does: open the confirmation page, then post its form with the token."""
    page = client.get(url)
    assert page.status_code == 200, page.status_code
    return client.post(url, {"note": note, "csrfmiddlewaretoken": csrf_token_of(page)}, follow=True)


def test_queue_lists_the_pending_oldest_first_and_the_decided_a_click_away(operator):
    now = timezone.now()
    decided_oldest = ApprovalFactory()
    Approval.objects.filter(pk=decided_oldest.pk).update(
        status=ApprovalStatus.EXPIRED, decided_at=now, requested_at=now - timedelta(hours=5)
    )
    newer = ApprovalFactory()
    older = ApprovalFactory()
    Approval.objects.filter(pk=newer.pk).update(requested_at=now - timedelta(hours=1))
    Approval.objects.filter(pk=older.pk).update(requested_at=now - timedelta(hours=2))
    client = csrf_client(operator)
    assert [a.pk for a in client.get(QUEUE).context["cl"].result_list] == [older.pk, newer.pk]
    everything = client.get(QUEUE, {"status__exact": "all"}).context["cl"].result_list
    assert [a.pk for a in everything] == [decided_oldest.pk, older.pk, newer.pk]
    assert [a.pk for a in client.get(QUEUE, {"status__exact": "expired"}).context["cl"].result_list] == [decided_oldest.pk]


def test_queue_shows_amount_order_customer_expiry_rule_and_decide_buttons(operator, pending_refund):
    body = csrf_client(operator).get(QUEUE).content.decode()
    row = body.split('id="result_list"', 1)[1]
    assert "execute_refund" in row and "order 9527" in row and "25.00" in row and ">alice<" in row
    assert re.search(r'data-countdown="[^"]+"[^>]*>in (59 m \d\d s|1 h 00 m)</time>', row), row  # never "in 0 minutes"
    assert "Operator approval" in row and "four eyes" in row  # the rule that applies
    assert approve_url(pending_refund.approval) in row and reject_url(pending_refund.approval) in row


def test_four_eyes_shows_why_the_viewer_may_not_decide(operator):
    own = ApprovalFactory(tool_call__step__run__session=SessionFactory(owner=operator))
    body = csrf_client(operator).get(QUEUE).content.decode()
    assert approve_url(own) not in body
    assert "Four eyes: raised in your own session" in body
    page = csrf_client(operator).get(reverse("admin:approvals_app_approval_change", args=[own.pk])).content.decode()
    assert 'id="barred-reason"' in page and "Four eyes" in page


def test_approval_page_shows_conversation_arguments_and_order_details(operator, pending_refund):
    url = reverse("admin:approvals_app_approval_change", args=[pending_refund.approval.pk])
    body = csrf_client(operator).get(url).content.decode()
    assert "Check order 9527 and refund it if it&#x27;s eligible" in body  # the conversation
    assert "Order 9527 is eligible; refunding it." in body
    assert '&quot;amount&quot;: &quot;25.00&quot;' in body  # pretty-printed arguments
    assert "query_order" in body and "&quot;refund_eligible&quot;: true" in body  # the order, from the read tool
    assert "idempotency key" in body.lower() and pending_refund.refund.idempotency_key in body
    assert 'id="approve-link"' in body and 'id="reject-link"' in body


def test_operator_approves_over_http_with_csrf(operator, pending_refund):
    approval = pending_refund.approval
    response = decide_over_http(csrf_client(operator), approve_url(approval), note="checked the order")
    assert response.redirect_chain[-1][0] == QUEUE
    assert any(m.startswith("Approved") for m in messages_of(response))
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.decided_by == operator and approval.note == "checked the order"
    # The same run resumes (queued for a worker); it is not a new run.
    assert Run.objects.get(pk=pending_refund.run.pk).status == RunStatus.QUEUED
    assert Run.objects.filter(session=pending_refund.run.session).count() == 1
    entry = AuditEntry.objects.get(object_id=str(approval.pk))
    assert (entry.actor, entry.action, entry.before, entry.after) == (
        operator, "approve", {"status": "pending"}, {"status": "approved"}
    )
    assert RunEvent.objects.filter(run=pending_refund.run, type="approval_decided").count() == 1


def test_a_post_without_the_csrf_token_is_refused(operator, pending_refund):
    response = csrf_client(operator).post(approve_url(pending_refund.approval), {"note": "no token"})
    assert response.status_code == 403
    pending_refund.approval.refresh_from_db()
    assert pending_refund.approval.status == ApprovalStatus.PENDING


def test_second_decision_is_told_who_decided_first(operator, pending_refund):
    from tests.support.desk import staff_user

    second = staff_user("second-operator", "decide_approval")
    first_client, second_client = csrf_client(operator), csrf_client(second)
    # Both operators open the confirmation page; the first one confirms.
    second_page = second_client.get(approve_url(pending_refund.approval))
    decide_over_http(first_client, approve_url(pending_refund.approval), note="first")
    response = second_client.post(
        approve_url(pending_refund.approval), {"note": "second", "csrfmiddlewaretoken": csrf_token_of(second_page)}, follow=True
    )
    assert any(m.startswith(f"Already approved by {operator.username} at ") for m in messages_of(response)), messages_of(response)
    pending_refund.approval.refresh_from_db()
    assert pending_refund.approval.decided_by == operator and pending_refund.approval.note == "first"
    assert AuditEntry.objects.filter(object_id=str(pending_refund.approval.pk)).count() == 1


def test_reject_needs_a_note_and_tells_the_model_only_what_is_meant_for_the_customer(operator, pending_refund):
    client = csrf_client(operator)
    page = client.get(reject_url(pending_refund.approval))
    response = client.post(reject_url(pending_refund.approval), {"note": "", "csrfmiddlewaretoken": csrf_token_of(page)})
    assert response.status_code == 200 and "This field is required" in response.content.decode()
    pending_refund.approval.refresh_from_db()
    assert pending_refund.approval.status == ApprovalStatus.PENDING

    page = client.get(reject_url(pending_refund.approval))
    response = client.post(reject_url(pending_refund.approval), {
        "note": "customer already compensated, ticket 4711", "customer_message": "We have sent you a voucher instead.",
        "csrfmiddlewaretoken": csrf_token_of(page),
    }, follow=True)
    assert any(m.startswith("Rejected") for m in messages_of(response))
    pending_refund.approval.refresh_from_db()
    assert pending_refund.approval.status == ApprovalStatus.REJECTED
    refund = ToolCall.objects.get(pk=pending_refund.refund.pk)
    assert refund.status == ToolCallStatus.CANCELLED and refund.error_code == "approval_rejected"
    told = Message.objects.get(session=pending_refund.run.session, role=MessageRole.TOOL, tool_call_id="call_r")
    # The model — which talks to the customer — is told who declined in general terms and the
    # message meant for the customer; the operator's note stays on the desk and in the audit trail.
    assert "ticket 4711" not in told.content and "compensated" not in told.content
    assert json.loads(told.content)["error"]["message"] == "An operator declined it. We have sent you a voucher instead."
    entry = AuditEntry.objects.get(object_id=str(pending_refund.approval.pk))
    assert entry.action == "reject" and entry.note == "customer already compensated, ticket 4711"
    assert entry.after == {"status": "rejected", "customer_message": "We have sent you a voucher instead."}


def test_staff_without_the_permission_sees_no_buttons_and_cannot_decide(viewer, pending_refund):
    approval = pending_refund.approval
    client = csrf_client(viewer)
    assert approve_url(approval) not in client.get(QUEUE).content.decode()
    page = client.get(reverse("admin:approvals_app_approval_change", args=[approval.pk]))
    assert page.status_code == 200 and 'id="approve-link"' not in page.content.decode()
    confirm = client.get(approve_url(approval))
    assert confirm.status_code == 403 and 'id="decide-form"' not in confirm.content.decode()
    response = client.post(approve_url(approval), {"note": "sneaky", "csrfmiddlewaretoken": csrf_token_of(page)})
    assert response.status_code == 403
    assert any(m.startswith("You may not decide this approval") for m in messages_of(response)), messages_of(response)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING and approval.decided_by is None
    assert not AuditEntry.objects.exists()
    assert Run.objects.get(pk=pending_refund.run.pk).status == RunStatus.WAITING
    # The service refuses on its own, whatever the interface.
    with pytest.raises(WardenError) as refused:
        approval_decide(approval=approval, decision="approve", note="", acting_user=viewer)
    assert refused.value.code is ApprovalRefusal.NOT_PERMITTED


def test_four_eyes_an_operator_cannot_approve_a_refund_from_their_own_session(operator):
    approval = ApprovalFactory(tool_call__step__run__session=SessionFactory(owner=operator))
    client = csrf_client(operator)
    assert client.get(approve_url(approval)).status_code == 403
    with pytest.raises(WardenError) as refused:
        approval_decide(approval=approval, decision="approve", note="", acting_user=operator)
    assert refused.value.code is ApprovalRefusal.NOT_PERMITTED
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING


def test_nothing_but_the_decision_page_changes_an_approval(operator, pending_refund):
    client = csrf_client(operator)
    change = reverse("admin:approvals_app_approval_change", args=[pending_refund.approval.pk])
    token = csrf_token_of(client.get(change))
    assert client.post(change, {"status": "approved", "csrfmiddlewaretoken": token}).status_code == 403
    delete = reverse("admin:approvals_app_approval_delete", args=[pending_refund.approval.pk])
    assert client.post(delete, {"post": "yes", "csrfmiddlewaretoken": token}).status_code == 403
    pending_refund.approval.refresh_from_db()
    assert pending_refund.approval.status == ApprovalStatus.PENDING


def test_queue_renders_at_a_constant_query_count_for_an_operator(operator):
    client = csrf_client(operator)
    ApprovalFactory()
    client.get(QUEUE)  # warm the permission cache of the session's user
    with CaptureQueriesContext(connection) as few:
        assert client.get(QUEUE).status_code == 200
    for _ in range(5):
        ApprovalFactory()
    with CaptureQueriesContext(connection) as many:
        assert client.get(QUEUE).status_code == 200
    assert len(many) == len(few)


def test_the_decide_permission_alone_opens_the_queue(pending_refund):
    from django.contrib.auth.models import Permission

    from tests.support.factories import UserFactory

    decider = UserFactory(username="decider", is_staff=True)
    decider.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    client = csrf_client(decider)
    assert client.get(QUEUE).status_code == 200
    response = decide_over_http(client, approve_url(pending_refund.approval), note="ok")
    assert any(m.startswith("Approved") for m in messages_of(response))
    pending_refund.approval.refresh_from_db()
    assert pending_refund.approval.decided_by == decider


def test_the_decide_permission_alone_shows_operator_requests_not_customers_confirmations(pending_refund):
    """The API's scope: deciding operator-level requests does not open every customer's own
    confirmations (nor the conversation shown with them)."""
    from django.contrib.auth.models import Permission

    from approvals_app.models import ApprovalPolicy
    from tests.support.factories import RunFactory, StepFactory, ToolCallFactory, UserFactory

    run = RunFactory(status=RunStatus.WAITING, phase="", wait_reason="approval")
    call = ToolCallFactory(run=run, step=StepFactory(run=run, kind="tools"), tool_name="execute_refund", effect="write",
                           idempotency_key="refund:user-level")
    confirmation = ApprovalFactory(tool_call=call, run=run, policy=ApprovalPolicy.USER)
    decider = UserFactory(username="decider", is_staff=True)
    decider.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    client = csrf_client(decider)
    queue = client.get(QUEUE).content.decode()
    assert str(pending_refund.approval.pk)[:8] in queue and str(confirmation.pk)[:8] not in queue
    assert client.get(reverse("admin:approvals_app_approval_change", args=[confirmation.pk])).status_code == 302


def test_bulk_reject_decides_each_request_on_its_own_and_skips_what_the_viewer_may_not_decide(operator, pending_refund):
    own = ApprovalFactory(tool_call__step__run__session=SessionFactory(owner=operator))
    other = ApprovalFactory()
    client = csrf_client(operator)
    token = csrf_token_of(client.get(QUEUE))
    selected = [str(pending_refund.approval.pk), str(own.pk), str(other.pk)]
    confirm = client.post(QUEUE, {"action": "reject_selected", "_selected_action": selected, "csrfmiddlewaretoken": token})
    page = confirm.content.decode()
    assert confirm.status_code == 200 and 'id="decide-form"' in page
    assert "skipped: Four eyes" in page and 'value="Yes, reject 2"' in page
    response = client.post(QUEUE, {
        "action": "reject_selected", "_selected_action": selected, "confirm": "yes", "note": "duplicate requests",
        "csrfmiddlewaretoken": csrf_token_of(confirm),
    }, follow=True)
    assert any(m.startswith("2 requests — ") for m in messages_of(response)), messages_of(response)
    assert any("Four eyes" in m for m in messages_of(response))
    statuses = dict(Approval.objects.filter(pk__in=selected).values_list("pk", "status"))
    assert statuses == {pending_refund.approval.pk: "rejected", own.pk: "pending", other.pk: "rejected"}
    assert AuditEntry.objects.filter(action="reject", actor=operator).count() == 2


def test_bulk_decisions_need_the_decide_permission(viewer, pending_refund):
    client = csrf_client(viewer)
    page = client.get(QUEUE).content.decode()
    assert "approve_selected" not in page
    response = client.post(QUEUE, {"action": "approve_selected", "_selected_action": [str(pending_refund.approval.pk)],
                                   "confirm": "yes", "csrfmiddlewaretoken": csrf_token_of(client.get(QUEUE))})
    pending_refund.approval.refresh_from_db()
    assert pending_refund.approval.status == ApprovalStatus.PENDING and response.status_code in (200, 302)


def test_a_late_decision_says_when_it_expired_in_words(operator, pending_refund):
    Approval.objects.filter(pk=pending_refund.approval.pk).update(expires_at=timezone.now() - timedelta(minutes=3))
    response = decide_over_http(csrf_client(operator), approve_url(pending_refund.approval), note="late")
    message = " ".join(messages_of(response))
    assert "expired at" in message and "3 minutes ago" in message and "+00:00" not in message, message
