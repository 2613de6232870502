"""Issue 31's first acceptance point against the real system (daphne, workers, the sweeper, the
simulated payment service, a real SMTP server and a real HTTP receiver standing in for a Slack
channel): the approval request sends both; the operator follows the e-mailed link in headless
Chromium, is sent to the console's login, back to the decision page, and approving books the refund
once; the same link again, an expired link, a tampered link and the customer's own link for their own
session decide nothing and say why. Screenshots at 1280×800 and 390×844 go to test-artifacts/screenshots/."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals_app.links import link_from_token
from approvals_app.models import ApprovalDecision, ApprovalLink, ApprovalStatus
from demo.selectors import sim_refund_count
from notifications.models import NotificationKind, WebhookEndpoint, WebhookFormat
from runs_app.models import Run, RunStatus
from tests.e2e.conftest import (
    browser_page, inside_viewport_horizontally, refund_waiting_for_approval, run_finished, screenshot, scrolls_sideways,
)
from tests.support.api import grant
from tests.support.factories import TEST_PASSWORD
from tests.support.links import link_for, link_path
from tests.support.mail import ChatReceiver, Mailbox, smtp_server_start
from tests.support.processes import wait_for

# The console's login, asked to send the person back to where they were going.
AT_LOGIN = re.compile(r"/console/login/\?next=/console/decide/")

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def sign_in_through_the_link(page, path: str, username: str) -> None:
    """Open the link signed out: the console's login asks who you are, then the link's page opens."""
    page.goto(path)
    page.wait_for_url(AT_LOGIN)
    page.fill('input[name="username"]', username)
    page.fill('input[name="password"]', TEST_PASSWORD)
    page.click('button[type="submit"]')
    page.wait_for_url(lambda url: url.endswith(path))


@pytest.fixture
def mail_and_chat():
    """The deployment's two channels, on this machine: an SMTP server and a Slack-compatible receiver."""
    mailbox, chat = Mailbox(), ChatReceiver()
    controller = smtp_server_start(mailbox)
    chat.thread.start()
    yield mailbox, controller.port, chat
    controller.stop()
    chat.server.shutdown()
    chat.server.server_close()


def test_following_the_emailed_link_signing_in_and_approving_books_the_refund_once(
        procs, demo_world, desk_operator, chromium, mail_and_chat):
    mailbox, smtp_port, chat = mail_and_chat
    WebhookEndpoint.objects.create(name="approvals channel", url=chat.url, format=WebhookFormat.SLACK,
                                   kinds=[NotificationKind.APPROVAL_REQUESTED])
    procs.start_web(simulator=True)
    # The workers write the notices (in the request's transaction) and deliver them: they know the
    # SMTP server and where the web server is, for the links.
    mail = {"WARDEN_APPROVAL_EMAIL": "1", "EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": str(smtp_port),
            "WARDEN_PUBLIC_URL": procs.base_url}
    procs.start_workers(workers=2, env=mail)
    procs.start_sweeper(env=mail)
    run, approval = refund_waiting_for_approval()
    customer = approval.run.session.owner

    # Both channels got the request: an e-mail to the operator holding their own link, and the
    # channel's message with a button for them.
    wait_for(lambda: mailbox.to(desk_operator.email), timeout=90, message="the operator's e-mail")
    wait_for(lambda: chat.received(), timeout=90, message="the chat message")
    (email,) = mailbox.to(desk_operator.email)
    assert "execute_refund" in email["Subject"]
    (url,) = re.findall(r"http://\S+/console/decide/\S+/", email.get_content())
    assert url.startswith(procs.base_url)
    path = url.removeprefix(procs.base_url)
    link = link_from_token(path.removeprefix("/console/decide/").rstrip("/"))
    assert (link.approval_id, link.decider_id, link.digest) == (approval.pk, desk_operator.pk, approval.digest)
    (message,) = chat.received()
    buttons = [element for block in message["blocks"] if block["type"] == "actions" for element in block["elements"]]
    assert any(desk_operator.username in button["text"]["text"] and "/console/decide/" in button["url"] for button in buttons)
    assert not mailbox.to(customer.email)  # the customer is told nothing of an operator's decision to make

    grant(customer, ("approvals_app", "decide_approval"))  # an operator's powers, but this is their own session
    expired = link_for(approval, desk_operator)
    ApprovalLink.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    own = link_for(approval, customer)
    tampered = path[:-3] + ("yy/" if path.endswith("xx/") else "xx/")  # two characters of the signature changed

    # The page as a phone shows it, before anything is decided (a GET decides nothing).
    phone = browser_page(chromium, procs.base_url, "phone")
    sign_in_through_the_link(phone, path, desk_operator.username)
    phone.locator("#decide-approve").wait_for()
    screenshot(phone, "decision-link-page", "phone")
    assert not scrolls_sideways(phone)
    assert inside_viewport_horizontally(phone, "#decide-approve") and inside_viewport_horizontally(phone, "#decide-reject")
    approve_box, reject_box = phone.locator("#decide-approve").bounding_box(), phone.locator("#decide-reject").bounding_box()
    assert (approve_box["width"], approve_box["height"]) == (reject_box["width"], reject_box["height"])
    assert ApprovalLink.objects.get(pk=link.pk).used_at is None  # opening it spent nothing

    page = browser_page(chromium, procs.base_url, "desktop")
    page.goto(path)
    page.wait_for_url(AT_LOGIN)
    screenshot(page, "decision-link-login", "desktop")
    page.fill('input[name="username"]', desk_operator.username)
    page.fill('input[name="password"]', TEST_PASSWORD)
    page.click('button[type="submit"]')
    page.wait_for_url(lambda url: url.endswith(path))
    assert "You decide as desk-operator." in page.inner_text("#decide-as")
    assert "25.00 USD" in page.inner_text("#decide-money")
    assert "refund it if it's eligible" in page.inner_text("#decide-conversation")
    screenshot(page, "decision-link-page", "desktop")
    assert not scrolls_sideways(page)

    # Before anything is decided: an expired link, a tampered one, the customer's own — none decides.
    page.goto(link_path(expired))
    assert "This link expired" in page.inner_text("#decide-refusal") and page.locator("#decide-approve").count() == 0
    screenshot(page, "decision-link-expired", "desktop")
    page.goto(tampered)
    assert "altered" in page.inner_text("#decide-refusal") and page.locator("#decide-approve").count() == 0
    assert "25.00" not in page.inner_text("main")  # nothing about any request
    screenshot(page, "decision-link-tampered", "desktop")
    own_page = browser_page(chromium, procs.base_url, "phone")
    sign_in_through_the_link(own_page, link_path(own), customer.username)
    assert "Four eyes" in own_page.inner_text("#decide-refusal") and own_page.locator("#decide-approve").count() == 0
    screenshot(own_page, "decision-link-own-session", "phone")

    page.goto(path)
    page.fill('textarea[name="note"]', "Order 9527 checked through the e-mailed link.")
    page.click("#decide-approve")
    page.locator("#decide-outcome").wait_for()
    assert "Approved — the run resumes and makes the execute_refund call (25.00 USD) now." in page.inner_text("#decide-outcome")
    screenshot(page, "decision-link-approved", "desktop")

    # The same link again: already used, no buttons.
    page.goto(path)
    assert "This link was already used" in page.inner_text("#decide-refusal")
    assert page.locator("#decide-approve").count() == 0
    screenshot(page, "decision-link-used", "desktop")
    phone.goto(path)
    assert "This link was already used" in phone.inner_text("#decide-refusal")
    screenshot(phone, "decision-link-used", "phone")

    wait_for(lambda: run_finished(run.pk), timeout=90, message="the run to be finished")
    stored = Run.objects.get(pk=run.pk)
    assert stored.status == RunStatus.COMPLETED, (stored.error_code, stored.error_detail)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and approval.decided_by == desk_operator
    assert ApprovalDecision.objects.filter(approval=approval).count() == 1
    assert sim_refund_count(order_id="9527") == 1
