"""The console as a customer meets it, in headless Chromium at 390×844 and 1280×800 against the
real system: Send works on a phone; an operator's note never reaches the customer's page, live or
reloaded (a DOM check), while the message meant for them does; the API's docs render with no
network at all. Screenshots go to test-artifacts/screenshots/."""

from urllib.parse import urlparse

import pytest

from approvals_app.models import Approval, ApprovalStatus
from runs_app.models import Run
from sessions_app.models import Message, MessageRole
from tests.e2e.conftest import browser_page, login, screenshot, scrolls_sideways
from tests.support.factories import UserFactory
from tests.support.processes import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

INTERNAL_NOTE = "INTERNAL: ticket 4711, second refund this month, fraud check passed"
FOR_THE_CUSTOMER = "Please contact our support line about order 9533."


def new_session(page, title: str) -> str:
    page.goto("/console/")
    page.fill('input[name="title"]', title)
    page.click('[data-testid="new-session"]')
    page.wait_for_selector('[data-role="connection"][data-state="live"]')
    return page.url.rstrip("/").rsplit("/", 1)[-1]


def send(page, text: str) -> None:
    page.fill('textarea[name="content"]', text)
    page.click('[data-role="send"]')


@pytest.mark.parametrize("size", ["phone", "desktop"])
def test_a_customer_sends_a_question_and_reads_the_answer(live_system, chromium, size):
    procs = live_system
    procs.start_web(simulator=True)
    procs.start_workers(workers=1)
    UserFactory(username="carol")
    page = browser_page(chromium, procs.base_url, size)
    login(page, "/console/login/", "carol")
    assert not scrolls_sideways(page)
    screenshot(page, "console-home", size)
    session_id = new_session(page, "Weather")
    send_button = page.locator('[data-role="send"]')
    box = send_button.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= page.viewport_size["width"]  # reachable, not off to the side
    assert box["height"] >= (44 if size == "phone" else 20)  # a thumb can hit it
    send(page, "What's the weather in Paris?")
    run = wait_for(lambda: Run.objects.filter(session_id=session_id).first(), timeout=30, message="the run to start")
    page.wait_for_selector(f'section#run-{run.pk}[data-status="completed"]')
    answer = Message.objects.filter(run=run, role=MessageRole.ASSISTANT).exclude(content="").get()
    assert answer.content.startswith("The weather in Paris is")
    assert page.inner_text(f'section#run-{run.pk} li.step[data-kind="model"] [data-role="text"] >> nth=-1') == answer.content
    assert page.input_value('textarea[name="content"]') == ""  # sent, and the box is ready for the next one
    # The sidebar's badge followed the run: no "running" left for a finished session.
    assert page.locator(f'[data-role="session-list"] li[data-session="{session_id}"] [data-role="session-badge"]').is_hidden()
    # Streamed text and state changes are announced to screen readers.
    assert page.locator('[data-role="announcer"][aria-live="polite"]').count() == 1
    assert page.locator('li.step[data-kind="model"] [data-role="text"][aria-live="polite"]').count() >= 1
    assert not scrolls_sideways(page)
    screenshot(page, "console-answered", size)


def test_the_customer_never_sees_the_operators_note_live_or_reloaded(live_system, chromium, desk_operator):
    procs = live_system
    procs.start_web(simulator=True)
    procs.start_workers(workers=2)
    procs.start_sweeper()
    UserFactory(username="dora")
    customer = browser_page(chromium, procs.base_url, "phone")
    login(customer, "/console/login/", "dora")
    session_id = new_session(customer, "Refund 9533")
    send(customer, "Check order 9533 and refund it if it's eligible")
    customer.wait_for_selector('section.run[data-status="waiting"] .waiting-operator')
    run = Run.objects.get(session_id=session_id)
    approval = Approval.objects.get(run=run, status=ApprovalStatus.PENDING)
    screenshot(customer, "console-refund-waiting-for-operator", "phone")

    desk = browser_page(chromium, procs.base_url, "desktop")
    login(desk, f"/admin/login/?next=/admin/approvals_app/approval/{approval.pk}/reject/", desk_operator.username)
    desk.fill("#id_note", INTERNAL_NOTE)
    desk.fill("#id_customer_message", FOR_THE_CUSTOMER)
    screenshot(desk, "desk-reject-with-a-message-for-the-customer", "desktop")
    desk.click("#confirm-decision")
    desk.wait_for_selector("ul.messagelist")

    section = f"section#run-{run.pk}"
    customer.wait_for_selector(f'{section}[data-status="completed"]')
    answer = Message.objects.filter(run=run, role=MessageRole.ASSISTANT).exclude(content="").order_by("-seq").first()
    assert FOR_THE_CUSTOMER in answer.content and "4711" not in answer.content  # what the model was told, and said
    for moment in ("live", "reloaded"):
        html = customer.evaluate("document.documentElement.outerHTML")
        assert "4711" not in html and "fraud" not in html and INTERNAL_NOTE not in html, moment
        assert desk_operator.username not in customer.inner_text("main"), moment
        assert FOR_THE_CUSTOMER in customer.inner_text(section), moment
        assert "Declined by an operator." in customer.inner_text(f"{section} .approval"), moment
        for raw in ("approval_rejected", "outcome_unknown", "not_applied"):
            assert raw not in customer.inner_text("main"), (moment, raw)
        screenshot(customer, f"console-declined-{moment}", "phone")
        customer.reload()
        customer.wait_for_selector('[data-role="connection"][data-state="live"]')
    assert Run.objects.get(pk=run.pk).outcome == "rejected"
    # The operator, watching the same session, does see the note.
    desk.goto(f"/console/sessions/{session_id}/")
    assert INTERNAL_NOTE in desk.inner_text(f"{section} .approval")


@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_the_api_docs_render_with_no_network(procs, chromium, size):
    procs.start_web()
    page = browser_page(chromium, procs.base_url, size)
    ours = urlparse(procs.base_url).netloc
    elsewhere = []

    def only_this_server(route):
        if urlparse(route.request.url).netloc == ours:
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page.route("**/*", only_this_server)
    page.goto("/api/v1/docs")
    page.wait_for_selector(".swagger-ui .info .title")
    assert "Warden" in page.inner_text(".swagger-ui .info .title")
    page.wait_for_selector(".swagger-ui .opblock-tag")  # the operations, from the local openapi.json
    assert page.locator(".swagger-ui .opblock").count() > 10
    assert elsewhere == [], elsewhere
    screenshot(page, "api-docs-offline", size)
