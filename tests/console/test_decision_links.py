"""The decision link's page (issue 31, point 1) through the Django test client against PostgreSQL:
a GET shows the request and never decides; the page's POST decides once and spends the link; a used,
expired, altered, unknown or outdated link, a link sent to someone else and the customer's own link
for their own session decide nothing and say why."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from approvals_app.models import Approval, ApprovalDecision, ApprovalLink, ApprovalStatus, AuditEntry, LedgerEntry
from engine.actions.approvals import approval_edit
from runs_app.models import Run, RunStatus
from tests.support.api import grant
from tests.support.desk import csrf_token_of
from tests.support.factories import UserFactory
from tests.support.links import link_decide, link_for, link_path, operator_named, refund_waiting, signed_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(db):
    return UserFactory(username="alice")


@pytest.fixture
def ann(db):
    return operator_named("op-ann")


@pytest.fixture
def bob(db):
    return operator_named("op-bob")


@pytest.fixture
def refund(alice) -> Approval:
    return refund_waiting(owner=alice)


def nothing_decided(approval: Approval) -> bool:
    approval.refresh_from_db()
    return (approval.status == ApprovalStatus.PENDING and approval.decided_by_id is None
            and not ApprovalDecision.objects.filter(approval=approval).exists()
            and not AuditEntry.objects.filter(object_id=str(approval.pk)).exists()
            and not LedgerEntry.objects.filter(subject=f"approval:{approval.pk}").exists()
            and Run.objects.get(pk=approval.run_id).status == RunStatus.WAITING)


def text(response) -> str:
    return response.content.decode()


def test_signed_out_the_link_sends_the_decider_to_the_console_login_and_back(refund, ann):
    link = link_for(refund, ann)
    response = Client().get(link_path(link))
    assert response.status_code == 302
    assert response["Location"].startswith("/console/login/?next=")
    assert link_path(link).replace(":", "%3A") in response["Location"]
    assert nothing_decided(refund)


def test_the_page_shows_the_request_and_a_get_never_decides(refund, ann):
    link = link_for(refund, ann)
    client = signed_in(ann)
    for _ in range(2):
        page = client.get(link_path(link))
        assert page.status_code == 200
        body = text(page)
        assert "You decide as op-ann." in body
        assert 'id="decide-approve"' in body and 'id="decide-reject"' in body and "csrfmiddlewaretoken" in body
        assert "execute_refund" in body and "25.00 USD" in body  # the tool and the money
        assert "<dt>order_id</dt><dd>9527</dd>" in body  # the arguments, as a readable list
        assert "Check order 9527 and refund it if it&#x27;s eligible" in body  # the customer's request
        assert "alice" in body and "four eyes" in body
        assert page["Cache-Control"] == "no-store"
    link.refresh_from_db()
    assert link.used_at is None
    assert nothing_decided(refund)


def test_approving_through_the_link_decides_once_and_spends_it(refund, ann):
    link = link_for(refund, ann)
    client = signed_in(ann)
    response = link_decide(client, link, "approve", note="order checked")
    assert response.status_code == 200, text(response)
    assert "Approved — the run resumes and makes the execute_refund call (25.00 USD) now." in text(response)
    assert 'id="decide-approve"' not in text(response)
    refund.refresh_from_db()
    assert refund.status == ApprovalStatus.APPROVED and refund.decided_by == ann and refund.note == "order checked"
    link.refresh_from_db()
    assert link.used_at is not None
    assert Run.objects.get(pk=refund.run_id).status == RunStatus.QUEUED  # the same run resumes

    again = link_decide(client, link, "approve")
    assert again.status_code == 409
    assert "already used" in text(again) and "decides nothing" in text(again)
    page = client.get(link_path(link))
    assert "This link was already used" in text(page) and 'id="decide-approve"' not in text(page)
    assert ApprovalDecision.objects.filter(approval=refund).count() == 1
    assert AuditEntry.objects.filter(object_id=str(refund.pk), action="approve").count() == 1
    assert LedgerEntry.objects.filter(subject=f"approval:{refund.pk}").count() == 1


def test_rejecting_through_the_link_passes_the_message_on(refund, ann):
    link = link_for(refund, ann)
    response = link_decide(signed_in(ann), link, "reject", note="duplicate", customer_message="It was refunded on Monday.")
    assert response.status_code == 200
    assert "Rejected — the execute_refund call (25.00 USD) is not made." in text(response)
    assert "It was refunded on Monday." in text(response)
    refund.refresh_from_db()
    assert refund.status == ApprovalStatus.REJECTED and refund.customer_message == "It was refunded on Monday."


def test_a_quorums_first_approval_through_a_link_is_recorded_and_the_second_decides(alice, ann, bob):
    approval = refund_waiting(owner=alice, required_approvals=2)
    first = link_decide(signed_in(ann), link_for(approval, ann))
    assert first.status_code == 200 and "Your approval is recorded: 1 of 2 approvals." in text(first)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    again = link_decide(signed_in(ann), link_for(approval, ann))  # a reminder's link: ann counts once
    assert again.status_code == 409 and "already approved" in text(again)
    second = link_decide(signed_in(bob), link_for(approval, bob))
    assert second.status_code == 200 and "Approved — " in text(second)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and ApprovalDecision.objects.filter(approval=approval).count() == 2


def test_a_post_without_the_csrf_token_is_refused(refund, ann):
    link = link_for(refund, ann)
    response = signed_in(ann).post(link_path(link), {"decision": "approve"})
    assert response.status_code == 403
    assert nothing_decided(refund)


def test_an_expired_link_says_so_and_decides_nothing(refund, ann):
    link = link_for(refund, ann)
    ApprovalLink.objects.filter(pk=link.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    client = signed_in(ann)
    page = client.get(link_path(link))
    assert page.status_code == 409 and "This link expired" in text(page) and 'id="decide-approve"' not in text(page)
    assert "The request is still open on the desk" in text(page)
    response = link_decide(client, link)
    assert response.status_code == 409 and "This link expired" in text(response)
    assert nothing_decided(refund)


def test_a_tampered_link_says_it_was_altered_and_decides_nothing(refund, ann):
    link = link_for(refund, ann)
    path = link_path(link)
    last = path[-2]
    tampered = path[:-2] + ("A" if last != "A" else "B") + "/"
    client = signed_in(ann)
    page = client.get(tampered)
    assert page.status_code == 400
    assert "altered" in text(page) and "decides nothing" in text(page) and 'id="decide-approve"' not in text(page)
    assert "execute_refund" not in text(page)  # nothing about any request
    response = client.post(tampered, {"decision": "approve", "csrfmiddlewaretoken": csrf_token_of(page)})
    assert response.status_code == 400
    assert nothing_decided(refund)


def test_a_signed_link_with_no_row_is_unknown(refund, ann):
    link = link_for(refund, ann)
    path = link_path(link)
    ApprovalLink.objects.filter(pk=link.pk).delete()
    page = signed_in(ann).get(path)
    assert page.status_code == 404 and "This link is unknown" in text(page)


def test_a_link_sent_before_an_edit_says_the_request_changed(refund, ann, bob):
    link = link_for(refund, ann)
    approval_edit(approval=refund, arguments={"order_id": "9527", "amount": "20.00", "reason": "customer request"},
                  reason="partial refund agreed", acting_user=bob)
    client = signed_in(ann)
    page = client.get(link_path(link))
    assert page.status_code == 409 and "The request changed after this link was sent" in text(page)
    assert 'id="decide-approve"' not in text(page)
    response = link_decide(client, link)
    assert response.status_code == 409 and "changed" in text(response)
    refund.refresh_from_db()
    assert refund.status == ApprovalStatus.PENDING and not ApprovalDecision.objects.filter(approval=refund).exists()
    link.refresh_from_db()
    assert link.used_at is None


def test_a_withdrawn_request_says_there_is_nothing_left_to_decide(refund, ann):
    link = link_for(refund, ann)
    Approval.objects.filter(pk=refund.pk).update(status=ApprovalStatus.WITHDRAWN, decided_at=timezone.now())
    client = signed_in(ann)
    page = client.get(link_path(link))
    assert page.status_code == 409 and "withdrawn" in text(page) and 'id="decide-approve"' not in text(page)
    assert link_decide(client, link).status_code == 409
    refund.refresh_from_db()
    assert refund.status == ApprovalStatus.WITHDRAWN and not ApprovalDecision.objects.filter(approval=refund).exists()


def test_an_expired_request_says_it_can_no_longer_be_decided(refund, ann):
    link = link_for(refund, ann)
    Approval.objects.filter(pk=refund.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    client = signed_in(ann)
    page = client.get(link_path(link))
    assert page.status_code == 409 and "This request expired" in text(page) and 'id="decide-approve"' not in text(page)
    assert link_decide(client, link).status_code == 409
    assert not ApprovalDecision.objects.filter(approval=refund).exists()


def test_a_link_sent_to_ann_opened_by_bob_says_whom_it_was_sent_to(refund, ann, bob):
    link = link_for(refund, ann)
    client = signed_in(bob)
    page = client.get(link_path(link))
    assert page.status_code == 409 and "This link was sent to op-ann" in text(page)
    assert 'id="decide-approve"' not in text(page)
    response = link_decide(client, link)
    assert response.status_code == 409 and "sent to op-ann" in text(response)
    assert nothing_decided(refund)
    link.refresh_from_db()
    assert link.used_at is None


def test_someone_who_may_not_see_the_request_sees_only_why(refund, ann):
    stranger = UserFactory(username="mallory")
    page = signed_in(stranger).get(link_path(link_for(refund, ann)))
    assert page.status_code == 409 and "sent to op-ann" in text(page)
    assert "9527" not in text(page) and "alice" not in text(page)


def test_the_customers_own_link_for_their_own_session_is_refused_by_four_eyes(refund, alice):
    grant(alice, ("approvals_app", "decide_approval"))
    link = link_for(refund, alice)
    client = signed_in(alice)
    page = client.get(link_path(link))
    assert page.status_code == 403 and "Four eyes" in text(page) and 'id="decide-approve"' not in text(page)
    response = link_decide(client, link)
    assert response.status_code == 403 and "Four eyes" in text(response)
    assert nothing_decided(refund)
    link.refresh_from_db()
    assert link.used_at is None


def test_a_decision_that_is_neither_approve_nor_reject_keeps_the_link(refund, ann):
    link = link_for(refund, ann)
    response = link_decide(signed_in(ann), link, "maybe")
    assert response.status_code == 422 and "Choose Approve or Reject" in text(response)
    assert 'id="decide-approve"' in text(response)
    assert nothing_decided(refund)
