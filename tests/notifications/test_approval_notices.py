"""Approvals reach people (issue 31; docs/NOTIFICATIONS.md): a request e-mails every person who may
decide it and posts the chat message, each with a decision link of their own — or writes nothing
when the request rolls back; a failed e-mail is sent later; a request past its service level is
reminded, then escalated to a second group, which the desk and the metrics show; a request decided
in time is never escalated; an out-of-office decider's notice goes to their delegate."""

import re
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from agents.definitions import AgentDefinitionInvalid, agent_definition_check
from approvals_app.links import link_from_token, why_link_unusable
from approvals_app.models import Approval, ApprovalLink, Delegation, LinkStage
from engine.actions.approvals import approval_decide
from engine.mailer import mails_send_due
from engine.sweeper import sweep_once
from engine.webhooks import webhooks_deliver_due
from notifications.models import DeliveryStatus, EmailDelivery, NotificationKind, WebhookDelivery, WebhookEndpoint
from operations.metrics import COLLECTOR
from runs_app.events import RunEventType
from runs_app.models import RunEvent
from tests.notifications.conftest import agent_with, decider, request_refund
from tests.support.desk import staff_user
from tests.support.factories import UserFactory
from tests.support.metrics import samples, value
from tests.support.processes import free_port, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LINK = re.compile(r"https?://\S+/console/decide/(\S+)/")
SERVICE_LEVEL = {"operator": {"notify": "operators", "remind_after": "10m", "escalate_after": "30m",
                              "escalate_to": "leads"}}


def _send_everything():
    mails_send_due()
    webhooks_deliver_due()


def _link_in(text: str) -> ApprovalLink:
    match = LINK.search(text)
    assert match, "the message holds no decision link"
    return link_from_token(match.group(1))


def _age(approval, minutes: int) -> None:
    """The request as if made `minutes` ago (what the sweeper compares with its service level)."""
    Approval.objects.filter(pk=approval.pk).update(requested_at=timezone.now() - timedelta(minutes=minutes))


def _buttons(body: dict) -> dict[str, ApprovalLink]:
    return {element["text"]["text"]: _link_in(element["url"])
            for block in body["blocks"] if block["type"] == "actions" for element in block["elements"]}


def test_a_request_emails_each_permitted_decider_and_posts_the_chat_message_with_their_links(smtp, chat, slack_endpoint,
                                                                                              people):
    approval = request_refund(owner=people["customer"])
    _send_everything()
    wait_for(lambda: len(smtp.received()) == 3 and len(chat.received()) == 1, timeout=60,
             message="three e-mails and one chat message")
    # Every operator who may decide; not carol (no permission), not the customer (their own session).
    assert sorted(m["To"] for m in smtp.received()) == ["alice@example.test", "bob@example.test", "lee@example.test"]
    approval.refresh_from_db()
    for message in smtp.received():
        person = people[message["To"].split("@")[0]]
        body = message.get_content()
        assert "execute_refund of 250.00 EUR for customer" in message["Subject"]
        assert "amount 250.00 > 100" in body and "customer" in body and "Expires:" in body
        link = _link_in(body)
        assert (link.approval_id, link.decider_id, link.on_behalf_of_id) == (approval.pk, person.pk, None)
        assert link.digest == approval.digest and link.stage == LinkStage.REQUESTED and link.used_at is None
        assert why_link_unusable(link=link, user=person) == ""
    (message,) = chat.received()
    assert "Approval requested" in message["text"] and "execute_refund" in message["text"]
    buttons = _buttons(message)
    assert sorted(buttons) == ["Decide as alice", "Decide as bob", "Decide as lee"]
    assert all(link.decider.get_username() == label.split()[-1] and link.approval_id == approval.pk
               for label, link in buttons.items())
    assert approval.notified_at is not None
    assert set(EmailDelivery.objects.values_list("status", flat=True)) == {DeliveryStatus.DELIVERED}


def test_a_standard_endpoint_keeps_its_signed_json_body(smtp, chat, people):
    endpoint = WebhookEndpoint.objects.create(name="integration", url=chat.url, kinds=[NotificationKind.APPROVAL_REQUESTED])
    approval = request_refund(owner=people["customer"])
    (delivery,) = WebhookDelivery.objects.filter(endpoint=endpoint)
    assert delivery.body["type"] == "approval.requested" and delivery.body["data"]["approval"] == str(approval.pk)


def test_nothing_is_written_when_the_requesting_transaction_rolls_back(smtp, slack_endpoint, people):
    with pytest.raises(RuntimeError), transaction.atomic():
        request_refund(owner=people["customer"])
        raise RuntimeError("the run's commit fails")
    assert not EmailDelivery.objects.exists()
    assert not WebhookDelivery.objects.exists()
    assert not ApprovalLink.objects.exists()
    _send_everything()
    assert smtp.received() == []


def test_a_customers_confirmation_notifies_no_operator(smtp, chat, slack_endpoint, people):
    """The customer confirms in the console; nobody else is told of it."""
    approval = request_refund(owner=people["customer"], policy="user")
    assert not EmailDelivery.objects.exists() and not ApprovalLink.objects.exists()
    assert not WebhookDelivery.objects.filter(endpoint=slack_endpoint).exists()
    assert Approval.objects.get(pk=approval.pk).notified_at is None


def test_an_email_that_fails_is_retried_and_sent_later(smtp, settings, people):
    settings.EMAIL_PORT = free_port()  # the mail server is down: nothing listens there
    request_refund(owner=people["customer"])
    assert mails_send_due() == 3
    failed = EmailDelivery.objects.all()
    assert {(d.status, d.attempts) for d in failed} == {(DeliveryStatus.PENDING, 1)}
    assert all(d.last_error and d.next_attempt_at > timezone.now() for d in failed)
    assert smtp.received() == []
    settings.EMAIL_PORT = smtp.controller.port  # it is back; the retries come due
    EmailDelivery.objects.update(next_attempt_at=timezone.now())
    assert mails_send_due() == 3
    wait_for(lambda: len(smtp.received()) == 3, timeout=60, message="the retried e-mails")
    assert {(d.status, d.attempts, d.last_error) for d in EmailDelivery.objects.all()} == {(DeliveryStatus.DELIVERED, 2, "")}


def test_past_its_service_level_a_request_is_reminded_then_escalated_and_the_desk_and_metrics_show_it(
        smtp, chat, slack_endpoint, people):
    approval = request_refund(owner=people["customer"], version=agent_with(SERVICE_LEVEL))
    _send_everything()
    # First the agent's `notify` group only.
    wait_for(lambda: len(smtp.received()) == 2, timeout=60, message="the operators' e-mails")
    assert sorted(m["To"] for m in smtp.received()) == ["alice@example.test", "bob@example.test"]

    _age(approval, 11)
    assert sweep_once()["approvals_reminded"] == 1
    assert sweep_once()["approvals_reminded"] == 0  # once
    _send_everything()
    wait_for(lambda: len(smtp.received()) == 4, timeout=60, message="the reminders")
    reminders = [m for m in smtp.received() if m["Subject"].startswith("[Warden] Reminder")]
    assert sorted(m["To"] for m in reminders) == ["alice@example.test", "bob@example.test"]
    assert {_link_in(m.get_content()).stage for m in reminders} == {LinkStage.REMINDER}

    _age(approval, 31)
    counts = sweep_once()
    assert (counts["approvals_escalated"], sweep_once()["approvals_escalated"]) == (1, 0)
    approval.refresh_from_db()
    assert approval.escalated_to == "leads" and approval.escalated_at is not None and approval.status == "pending"
    (event,) = RunEvent.objects.filter(run_id=approval.run_id, type=RunEventType.APPROVAL_ESCALATED)
    assert event.payload["escalated_to"] == "leads" and event.payload["approval"] == str(approval.pk)
    _send_everything()
    wait_for(lambda: len(smtp.to("lee@example.test")) == 1, timeout=60, message="the lead's e-mail")
    (escalation,) = smtp.to("lee@example.test")
    assert escalation["Subject"].startswith("[Warden] Escalated to leads")
    link = _link_in(escalation.get_content())
    assert (link.decider_id, link.stage) == (people["lee"].pk, LinkStage.ESCALATION)
    wait_for(lambda: any("Escalated to leads" in body["text"] for body in chat.received()), timeout=60,
             message="the escalation's chat message")
    (posted,) = [body for body in chat.received() if "Escalated to leads" in body["text"]]
    assert sorted(_buttons(posted)) == ["Decide as lee"]
    assert WebhookDelivery.objects.filter(kind=NotificationKind.APPROVAL_ESCALATED, event_seq=event.seq).count() == 1

    # The desk shows it, and lists it under "escalated".
    client = Client()
    client.force_login(staff_user("desk-operator", "decide_approval"))
    queue = client.get(reverse("admin:approvals_app_approval_changelist"), {"escalated": "yes"})
    assert [a.pk for a in queue.context["cl"].result_list] == [approval.pk]
    assert "escalated to leads" in queue.content.decode()
    assert not client.get(reverse("admin:approvals_app_approval_changelist"), {"escalated": "no"}).context["cl"].result_list

    # Nothing approved it: the lead decides, and the metrics count the escalation and the decision.
    approval_decide(approval=approval, decision="approve", acting_user=people["lee"])
    COLLECTOR.clear()
    found = samples(client.get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode())
    assert value(found, "warden_approval_escalations_total", policy="operator") == 1
    assert value(found, "warden_approval_decision_seconds_count", policy="operator") == 1
    assert value(found, "warden_email_deliveries_total", kind="approval.escalated", status="delivered") == 1


def test_a_request_decided_before_its_escalation_sends_none(smtp, chat, slack_endpoint, people):
    approval = request_refund(owner=people["customer"], version=agent_with(SERVICE_LEVEL))
    approval_decide(approval=approval, decision="approve", acting_user=people["alice"])
    _age(approval, 31)
    counts = sweep_once()
    assert (counts["approvals_reminded"], counts["approvals_escalated"]) == (0, 0)
    assert not RunEvent.objects.filter(type=RunEventType.APPROVAL_ESCALATED).exists()
    assert not EmailDelivery.objects.filter(kind=NotificationKind.APPROVAL_ESCALATED).exists()
    assert not WebhookDelivery.objects.filter(kind=NotificationKind.APPROVAL_ESCALATED).exists()
    assert Approval.objects.get(pk=approval.pk).escalated_at is None


def test_an_out_of_office_deciders_notice_goes_to_their_delegate(smtp, people):
    stand_in = UserFactory(username="dana", email="dana@example.test", is_staff=True)
    now = timezone.now()
    Delegation.objects.create(delegator=people["alice"], delegate=stand_in, starts_at=now - timedelta(hours=1),
                              ends_at=now + timedelta(days=1), created_by=people["alice"], reason="holiday")
    approval = request_refund(owner=people["customer"], version=agent_with(SERVICE_LEVEL))
    assert sorted(EmailDelivery.objects.values_list("to", flat=True)) == ["bob@example.test", "dana@example.test"]
    link = _link_in(EmailDelivery.objects.get(to="dana@example.test").body)
    assert (link.decider_id, link.on_behalf_of_id, link.approval_id) == (stand_in.pk, people["alice"].pk, approval.pk)
    assert "in place of alice" in EmailDelivery.objects.get(to="dana@example.test").body


def test_a_delegate_who_is_told_in_their_own_right_gets_one_notice(smtp, people):
    now = timezone.now()
    Delegation.objects.create(delegator=people["alice"], delegate=people["bob"], starts_at=now - timedelta(hours=1),
                              ends_at=now + timedelta(days=1), created_by=people["alice"])
    request_refund(owner=people["customer"], version=agent_with(SERVICE_LEVEL))
    assert list(EmailDelivery.objects.values_list("to", flat=True)) == ["bob@example.test"]
    assert ApprovalLink.objects.get().on_behalf_of_id is None


@pytest.mark.parametrize("levels, field, words", [
    ({"operator": {"notify": "nobody-here"}}, "approval_service_levels.operator.notify", "unknown group 'nobody-here'"),
    ({"operator": {"remind_after": "30m", "escalate_after": "10m", "escalate_to": "leads"}},
     "approval_service_levels.operator.remind_after", "not before escalate_after"),
    ({"operator": {"escalate_after": "2d", "escalate_to": "leads"}}, "approval_service_levels.operator.escalate_after",
     "not before the request expires"),
    ({"operator": {"remind_after": "10m", "page": "yes"}}, "approval_service_levels.operator", "unknown key 'page'"),
    ({"user": {"remind_after": "10m"}}, "approval_service_levels.user", "only the operator tier"),
    ({"operator": {"remind_after": "ten minutes"}}, "approval_service_levels.operator.remind_after", "a duration"),
    ({"operator": {"escalate_after": "30m"}}, "approval_service_levels.operator.escalate_to", "go together"),
])
def test_the_agent_definition_refuses_a_bad_service_level_naming_the_field(people, levels, field, words):
    definition = {"name": "Refunds", "instructions": "Refund eligible orders.", "provider": "scripted",
                  "tools": ["query_order", "execute_refund"], "approval_service_levels": levels}
    with pytest.raises(AgentDefinitionInvalid) as refused:
        agent_definition_check(definition)
    assert words in refused.value.errors[field]


def test_a_good_service_level_is_kept(people):
    definition = {"name": "Refunds", "instructions": "Refund eligible orders.", "provider": "scripted",
                  "tools": ["query_order", "execute_refund"], "approval_service_levels": SERVICE_LEVEL}
    assert agent_definition_check(definition)["approval_service_levels"] == SERVICE_LEVEL


def test_a_teams_endpoint_gets_a_message_card_with_one_action_per_decider(smtp, chat, people):
    endpoint = WebhookEndpoint.objects.create(name="teams", url=chat.url, format="teams",
                                              kinds=[NotificationKind.APPROVAL_REQUESTED])
    approval = request_refund(owner=people["customer"])
    (delivery,) = WebhookDelivery.objects.filter(endpoint=endpoint)
    card = delivery.body
    assert card["@type"] == "MessageCard" and "execute_refund" in card["text"]
    actions = {action["name"]: _link_in(action["targets"][0]["uri"]) for action in card["potentialAction"]}
    assert sorted(actions) == ["Decide as alice", "Decide as bob", "Decide as lee"]
    assert {link.approval_id for link in actions.values()} == {approval.pk}


def test_the_desk_lists_emails_without_their_bodies_and_shows_an_approvals_notice_times(smtp, people):
    approval = request_refund(owner=people["customer"])
    email = EmailDelivery.objects.order_by("to").first()
    token = LINK.search(email.body).group(1)
    client = Client()
    client.force_login(staff_user("desk-reader", "decide_approval"))
    listing = client.get(reverse("admin:notifications_emaildelivery_changelist"))
    page = client.get(reverse("admin:notifications_emaildelivery_change", args=[email.pk]))
    assert listing.status_code == page.status_code == 200
    assert "alice@example.test" in listing.content.decode() and email.subject in page.content.decode()
    assert token not in listing.content.decode() and token not in page.content.decode()
    detail = client.get(reverse("admin:approvals_app_approval_change", args=[approval.pk])).content.decode()
    assert "Notified at" in detail and "Escalated to" in detail
