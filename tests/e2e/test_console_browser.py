"""The live console in headless Chromium against the real system: daphne, django-q2 workers,
the scripted model and the simulated payment service. A customer asks for a refund and
watches it; an operator approves it in the admin in a second browser; the customer's page
follows waiting → running → completed without a reload. Screenshots of the key moments go
to test-artifacts/screenshots/."""

import os
import shutil
from pathlib import Path

import pytest
from django.db import connections
from django.test import override_settings

from approvals_app.models import Approval, ApprovalStatus
from runs_app.models import Run, RunStatus
from demo.model import HELP_TEXT
from sessions_app.models import Message, MessageRole
from engine.actions.sessions import session_open
from tests.e2e.conftest import REFUND_REQUEST
from tests.support.factories import TEST_PASSWORD, UserFactory
from tests.support.processes import ROOT

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
# Bounds a hung wait (milliseconds); nothing asserts how long anything took.
WAIT_MS = 90_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    # In CI a missing browser must fail loudly, never skip.
    pytest.mark.skipif(not Path(CHROMIUM).exists() and not os.environ.get("CI"), reason="chromium is not installed"),
]

# Records, in the page, every status each run section shows and every text each streamed
# step shows, so a test can check the sequence afterwards without timing anything.
RECORDER = """() => {
  window.__sameDocument = true;
  window.__statuses = [];
  window.__texts = {};
  const record = () => {
    document.querySelectorAll("section.run").forEach((section) => {
      const mine = window.__statuses.filter((entry) => entry[0] === section.dataset.runId);
      const last = mine[mine.length - 1];
      if (!last || last[1] !== section.dataset.status) window.__statuses.push([section.dataset.runId, section.dataset.status]);
      section.querySelectorAll('li.step[data-kind="model"] [data-role="text"]').forEach((node) => {
        const key = section.dataset.runId + ":" + node.closest("li").dataset.step;
        const seen = window.__texts[key] || (window.__texts[key] = []);
        if (seen[seen.length - 1] !== node.textContent) seen.push(node.textContent);
      });
    });
  };
  new MutationObserver(record).observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true, attributeFilter: ["data-status"]});
  record();
}"""


@pytest.fixture
def browser():
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop in this thread
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
        # Connections opened while Playwright's loop ran are not the ones pytest-django closes.
        connections.close_all()


@pytest.fixture
def console_server(procs, demo_world):
    """daphne and workers; what this process publishes goes through the test database's layer."""
    from tests.support.console import postgres_layer_for_test_db, postgres_layer_pool_drop

    postgres_layer_pool_drop()
    with override_settings(CHANNEL_LAYERS=postgres_layer_for_test_db()):
        yield procs
    postgres_layer_pool_drop()


def console_login(browser, base_url: str, username: str):
    context = browser.new_context(base_url=base_url, viewport={"width": 1200, "height": 900})
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    page.goto("/console/")
    assert "/console/login/" in page.url  # login required
    page.fill('input[name="username"]', username)
    page.fill('input[name="password"]', TEST_PASSWORD)
    page.click('button[type="submit"]')
    page.wait_for_url("**/console/")
    return page


def open_new_session(page, title: str) -> str:
    page.fill('input[name="title"]', title)
    page.click('[data-testid="new-session"]')
    page.wait_for_selector('[data-role="connection"][data-state="live"]')
    page.evaluate(RECORDER)
    return page.url.rstrip("/").rsplit("/", 1)[-1]


def send(page, text: str) -> None:
    page.fill('textarea[name="content"]', text)
    page.click('[data-role="send"]')


def shot(page, name: str) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def in_order(sequence: list[str], wanted: list[str]) -> bool:
    position = 0
    for item in sequence:
        if position < len(wanted) and item == wanted[position]:
            position += 1
    return position == len(wanted)


def test_customer_watches_a_refund_that_an_operator_approves_in_the_admin(console_server, browser, desk_operator):
    procs = console_server
    procs.start_web(simulator=True)
    # A slower model, so the answer visibly streams in pieces.
    procs.start_workers(workers=2, env={"WARDEN_SCRIPTED_DELAY_SECONDS": "0.1"})
    UserFactory(username="carol")

    page = console_login(browser, procs.base_url, "carol")
    session_id = open_new_session(page, "Refund for order 9527")
    send(page, REFUND_REQUEST)
    page.wait_for_selector('section.run[data-status="waiting"] .waiting-operator')
    run = Run.objects.get(session_id=session_id)
    section = f'section#run-{run.pk}'
    assert page.inner_text(f'{section} [data-tool-call] .tool-name >> nth=0') == "query_order"
    assert page.locator(f'{section} .tool-card.status-succeeded').count() == 1
    assert page.locator(f'{section} .tool-card.status-pending .tool-name').inner_text() == "execute_refund"
    assert "Waiting for an operator to approve this." in page.inner_text(f"{section} .approval")
    assert page.locator(f"{section} .approval a").count() == 0  # no admin link for a customer
    shot(page, "01-customer-refund-waiting-for-operator")

    # The operator, in a browser of their own, approves in the admin's queue.
    approval = Approval.objects.get(run=run, status=ApprovalStatus.PENDING)
    operator = browser.new_context(base_url=procs.base_url, viewport={"width": 1200, "height": 900})
    operator.set_default_timeout(WAIT_MS)
    desk = operator.new_page()
    desk.goto("/admin/login/?next=/admin/approvals_app/approval/")
    desk.fill("#id_username", desk_operator.username)
    desk.fill("#id_password", TEST_PASSWORD)
    desk.click('input[type="submit"]')
    desk.wait_for_url("**/admin/approvals_app/approval/")
    desk.click(f'a[href="/admin/approvals_app/approval/{approval.pk}/approve/"]')
    desk.fill('[name="note"]', "order 9527 checked, eligible")
    shot(desk, "02-operator-approves-in-admin")
    desk.click("#confirm-decision")
    desk.wait_for_url("**/admin/approvals_app/approval/")

    # The customer's page follows the run to its end by itself.
    page.wait_for_selector(f'{section}[data-status="completed"]')
    shot(page, "03-customer-refund-completed")
    assert page.evaluate("window.__sameDocument") is True  # never reloaded
    statuses = [status for run_id, status in page.evaluate("window.__statuses") if run_id == str(run.pk)]
    assert in_order(statuses, ["waiting", "running", "completed"]), statuses
    # The customer learns an operator approved; the operator's name and note stay on the desk.
    assert "Approved by an operator." in page.inner_text(f"{section} .approval")
    assert "order 9527 checked, eligible" not in page.content() and "desk-operator" not in page.inner_text("main")
    assert page.locator(f"{section} .tool-card.status-succeeded").count() == 2

    answer = Message.objects.filter(run=run, role=MessageRole.ASSISTANT).exclude(content="").get()
    assert answer.content.startswith("Done: the refund of 25.00 USD for order 9527")
    shown = page.inner_text(f'{section} li.step[data-step="{answer.step.index}"] [data-role="text"]')
    assert shown == answer.content
    assert page.inner_text("main").count("Done: the refund") == 1
    # It streamed: the page showed the answer growing, every stage a prefix of the final text.
    stages = page.evaluate("window.__texts")[f"{run.pk}:{answer.step.index}"]
    partial = [text for text in stages if text and text != answer.content]
    assert partial and all(answer.content.startswith(text) for text in stages), stages
    operator.close()


def test_a_reload_in_the_middle_of_a_stream_shows_no_duplicated_text(console_server, browser):
    procs = console_server
    procs.start_web()
    # The help text streams in 18 pieces, 0.4 s apart: long enough to reload in the middle.
    procs.start_workers(workers=1, env={"WARDEN_SCRIPTED_DELAY_SECONDS": "0.4"})
    UserFactory(username="dave")
    page = console_login(browser, procs.base_url, "dave")
    session_id = open_new_session(page, "Help me")
    send(page, "hello")
    bubble = 'li.step[data-kind="model"] [data-role="text"]'
    page.wait_for_function(f"() => {{ const n = document.querySelector('{bubble}'); return n && n.textContent.length > 0; }}")

    page.reload()
    page.evaluate(RECORDER)
    page.wait_for_selector('[data-role="connection"][data-state="live"]')
    shot(page, "04-reloaded-in-the-middle-of-a-stream")
    run = Run.objects.get(session_id=session_id)
    page.wait_for_selector(f'section#run-{run.pk}[data-status="completed"]')
    shot(page, "05-stream-finished-after-reload")

    assert page.inner_text(bubble) == HELP_TEXT
    assert page.inner_text("main").count(HELP_TEXT) == 1
    (stages,) = page.evaluate("window.__texts").values()
    assert all(HELP_TEXT.startswith(text) for text in stages), stages  # never a repeated piece
    assert any(0 < len(text) < len(HELP_TEXT) for text in stages), stages  # reloaded mid-stream
    assert Run.objects.get(pk=run.pk).status == RunStatus.COMPLETED


def test_typing_while_busy_offers_the_modes_and_cancel_stops_the_run(console_server, browser):
    procs = console_server
    procs.start_web(simulator=True)
    procs.start_workers(workers=1, env={"WARDEN_SCRIPTED_DELAY_SECONDS": "0.3"})
    UserFactory(username="erin")
    page = console_login(browser, procs.base_url, "erin")
    session_id = open_new_session(page, "Busy")
    assert not page.is_visible('[data-role="modes"]')  # nothing is running: no modes to choose
    send(page, "hello")
    page.wait_for_selector('section.run[data-status="running"]')
    assert page.is_visible('[data-role="modes"]')
    page.check('input[name="mode"][value="queue"]')
    send(page, "What's the weather in Paris?")
    page.wait_for_selector('[data-role="pending-inputs"] li:has-text("What\'s the weather in Paris?")')
    assert "queue" in page.inner_text('[data-role="pending-inputs"]')
    first = Run.objects.get(session_id=session_id)
    page.click(f'section#run-{first.pk} [data-role="cancel"]')
    page.click(f'section#run-{first.pk} [data-role="cancel-yes"]')  # the confirmation first (issue 29)
    page.wait_for_selector(f'section#run-{first.pk}[data-status="cancelled"]')
    # The status comes with the event; the final state (effects) as the server renders it, just after.
    page.wait_for_selector(f'section#run-{first.pk} [data-role="effects"]')
    assert "No side effects were applied." in page.inner_text(f"section#run-{first.pk}")
    # The queued question starts the next run as the first one ends; it appears by itself.
    page.wait_for_function("() => document.querySelectorAll('section.run').length === 2")
    second = Run.objects.filter(session_id=session_id).exclude(pk=first.pk).get()
    page.wait_for_selector(f'section#run-{second.pk}[data-status="completed"]')
    shot(page, "07-cancelled-run-and-the-queued-question-answered")
    assert "The weather in Paris is" in page.inner_text(f"section#run-{second.pk}")
    assert page.inner_text('[data-role="pending-inputs"]').strip() == ""
    assert not page.is_visible('[data-role="modes"]')
    assert page.evaluate("window.__sameDocument") is True


def test_a_user_cannot_open_another_users_session(console_server, browser):
    procs = console_server
    procs.start_web()
    alice = UserFactory(username="alice-owner")
    UserFactory(username="mallory")
    private = session_open(owner=alice, title="alice's refunds")

    page = console_login(browser, procs.base_url, "mallory")
    response = page.goto(f"/console/sessions/{private.pk}/")
    assert response.status == 404
    shot(page, "06-other-users-session-is-404")
    page.goto("/console/")
    assert "alice's refunds" not in page.inner_text("body")

    # Her own browser's socket (same origin, her cookie) may not subscribe to it either.
    answer = page.evaluate(
        """(sessionId) => new Promise((resolve) => {
             const socket = new WebSocket("ws://" + location.host + "/ws/console/");
             socket.onopen = () => socket.send(JSON.stringify({action: "subscribe", session: sessionId, after: {}}));
             socket.onmessage = (event) => { resolve(JSON.parse(event.data)); socket.close(); };
             socket.onclose = (event) => resolve({closed: event.code});
           })""",
        str(private.pk),
    )
    assert (answer.get("type"), answer.get("code")) == ("error", "not_found"), answer

    # And a browser that is not logged in cannot open a socket at all.
    anonymous = browser.new_context(base_url=procs.base_url)
    blank = anonymous.new_page()
    blank.goto("/console/login/")
    closed = blank.evaluate(
        """() => new Promise((resolve) => {
             const socket = new WebSocket("ws://" + location.host + "/ws/console/");
             socket.onopen = () => resolve({opened: true});
             socket.onclose = (event) => resolve({closed: event.code});
           })"""
    )
    assert closed == {"closed": 1006}, closed
    anonymous.close()
