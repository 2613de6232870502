"""Cancelling runs from the admin (SPEC §9): through run_cancel_request, with a reason, by staff
holding runs_app.change_run; the run page lists the side effects already applied."""

import pytest
from django.urls import reverse
from django.utils import timezone

from approvals_app.models import ApprovalStatus, AuditEntry
from runs_app.models import Run, RunStatus
from tests.support.desk import csrf_client, csrf_token_of, messages_of
from tests.support.factories import RunFactory, ToolCallFactory
from tools_app.models import ToolCallStatus, ToolEffect

pytestmark = pytest.mark.django_db


def run_page(run) -> str:
    return reverse("admin:runs_app_run_change", args=[run.pk])


def cancel_url(run) -> str:
    return reverse("admin:runs_app_run_cancel", args=[run.pk])


def test_cancel_button_asks_for_a_reason_then_cancels_a_waiting_run(canceller, pending_refund):
    run = pending_refund.run
    client = csrf_client(canceller)
    assert 'id="cancel-run-link"' in client.get(run_page(run)).content.decode()
    page = client.get(cancel_url(run))
    token = csrf_token_of(page)
    refused = client.post(cancel_url(run), {"reason": "", "csrfmiddlewaretoken": token})
    assert refused.status_code == 400 and Run.objects.get(pk=run.pk).cancel_requested_at is None
    response = client.post(cancel_url(run), {"reason": "customer withdrew the request", "csrfmiddlewaretoken": token}, follow=True)
    assert f"Run {run.pk} is cancelled." in messages_of(response)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.cancel_requested_by == canceller
    assert run.cancel_reason == "customer withdrew the request"
    pending_refund.approval.refresh_from_db()
    assert (pending_refund.approval.status, pending_refund.approval.decided_by) == (ApprovalStatus.WITHDRAWN, canceller)
    entry = AuditEntry.objects.get(action="cancel", object_id=str(run.pk))
    assert entry.actor == canceller and entry.before == {"status": "waiting"} and entry.after == {"cancel_requested": True}


def test_cancel_of_a_run_waiting_on_an_unknown_write_waits_for_reconciliation(canceller, unknown_refund):
    run = unknown_refund.run
    client = csrf_client(canceller)
    page = client.get(cancel_url(run))
    response = client.post(cancel_url(run), {"reason": "stop", "csrfmiddlewaretoken": csrf_token_of(page)}, follow=True)
    assert any("waits for its unknown write to be reconciled" in m for m in messages_of(response)), messages_of(response)
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING and run.cancel_requested_at is not None


def test_cancel_action_on_the_run_list(canceller):
    runs = [RunFactory(), RunFactory()]
    client = csrf_client(canceller)
    changelist = reverse("admin:runs_app_run_changelist")
    page = client.get(changelist)
    selected = [str(r.pk) for r in runs]
    intermediate = client.post(changelist, {
        "action": "request_cancel", "_selected_action": selected, "csrfmiddlewaretoken": csrf_token_of(page),
    })
    assert intermediate.status_code == 200 and 'id="cancel-form"' in intermediate.content.decode()
    assert all(r.status == RunStatus.QUEUED for r in Run.objects.filter(pk__in=selected))
    response = client.post(changelist, {
        "action": "request_cancel", "_selected_action": selected, "confirm": "yes", "reason": "runaway batch",
        "csrfmiddlewaretoken": csrf_token_of(intermediate),
    }, follow=True)
    assert response.status_code == 200
    assert set(Run.objects.filter(pk__in=selected).values_list("status", flat=True)) == {RunStatus.CANCELLED}
    assert AuditEntry.objects.filter(action="cancel", actor=canceller).count() == 2


def test_staff_without_change_run_cannot_cancel(viewer, pending_refund):
    run = pending_refund.run
    client = csrf_client(viewer)
    page = client.get(run_page(run))
    assert 'id="cancel-run-link"' not in page.content.decode()
    assert "request_cancel" not in client.get(reverse("admin:runs_app_run_changelist")).content.decode()
    assert client.get(cancel_url(run)).status_code == 403
    token = csrf_token_of(page)
    assert client.post(cancel_url(run), {"reason": "x", "csrfmiddlewaretoken": token}).status_code == 403
    client.post(reverse("admin:runs_app_run_changelist"), {
        "action": "request_cancel", "_selected_action": [str(run.pk)], "confirm": "yes", "reason": "x", "csrfmiddlewaretoken": token,
    })
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING and run.cancel_requested_at is None
    assert not AuditEntry.objects.exists()


def test_run_page_lists_applied_side_effects(canceller, pending_refund):
    run = pending_refund.run
    booked = {"refund_id": "rf_0001", "amount": "25.00"}
    ToolCallFactory(
        run=run, step=pending_refund.refund.step, index=1, tool_name="execute_refund", effect=ToolEffect.WRITE,
        status=ToolCallStatus.SUCCEEDED, idempotency_key="execute_refund:earlier", result=booked, finished_at=timezone.now(),
    )
    body = csrf_client(canceller).get(run_page(run)).content.decode()
    summary = body.split('id="run-summary"', 1)[1].split("</section>", 1)[0]  # at the top of the page
    assert "Applied effects" in summary and "execute_refund:earlier" in summary and "rf_0001" in summary


def test_run_page_says_when_nothing_was_applied(canceller, pending_refund):
    body = csrf_client(canceller).get(run_page(pending_refund.run)).content.decode()
    assert "None: no write of this run took effect." in body
