"""Interjections and cancel that respect intent (issue 29), in headless Chromium against the real
system (daphne, a django-q2 worker, the scripted model, the simulated payment service): what the
customer added to a request that is then cancelled is offered back — send it as a new request or
drop it — and never starts a run by itself; cancelling a run whose refund is on its way asks
first and says what has happened and what will not. Screenshots at 1280×800 and 390×844 go to
test-artifacts/screenshots/."""

import pytest

from approvals_app.models import Approval, ApprovalStatus
from runs_app.models import Run, RunStatus, WaitReason
from sessions_app.models import InputDisposition, Message, MessageRole, PendingInput
from tests.e2e.conftest import VIEWPORTS, REFUND_REQUEST, browser_page, login, screenshot, scrolls_sideways
from tests.support.chaos import approve_pending
from tests.support.factories import UserFactory
from tests.support.processes import wait_for
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SUPPLEMENT = "Could you tell me the order number?"


def new_session(page, title: str) -> str:
    page.goto("/console/")
    page.fill('input[name="title"]', title)
    page.click('[data-testid="new-session"]')
    page.wait_for_selector('[data-role="connection"][data-state="live"]')
    return page.url.rstrip("/").rsplit("/", 1)[-1]


def send(page, text: str, mode: str | None = None) -> None:
    page.fill('textarea[name="content"]', text)
    if mode:
        page.check(f'input[name="mode"][value="{mode}"]')
    page.click('[data-role="send"]')


def waiting_for_approval(session_id) -> Run:
    return wait_for(lambda: Run.objects.filter(session_id=session_id, status=RunStatus.WAITING,
                                               wait_reason=WaitReason.APPROVAL).first(),
                    timeout=60, message="the refund to wait for an operator")


def phone_view(chromium, base_url: str, username: str, session_id: str):
    """The same customer's phone, on the same session."""
    phone = browser_page(chromium, base_url, "phone")
    login(phone, "/console/login/", username)
    phone.goto(f"/console/sessions/{session_id}/")
    phone.wait_for_selector('[data-role="connection"][data-state="live"]')
    return phone


def open_confirmation(page, run: Run):
    page.click(f'section#run-{run.pk} [data-role="cancel"]')
    return page.wait_for_selector(f'section#run-{run.pk} [data-role="cancel-confirm"]')


def test_a_supplement_to_a_cancelled_run_is_offered_back_and_starts_nothing_unasked(live_system, chromium):
    procs = live_system
    procs.start_web(simulator=True)
    procs.start_workers(workers=1)
    UserFactory(username="dana")
    page = browser_page(chromium, procs.base_url, "desktop")
    login(page, "/console/login/", "dana")
    session_id = new_session(page, "Refund, then more")
    send(page, REFUND_REQUEST)
    run = waiting_for_approval(session_id)
    page.wait_for_selector(f'section#run-{run.pk}[data-status="waiting"]')
    send(page, SUPPLEMENT, mode="supplement")  # "Add to the current request"
    page.wait_for_selector(f'[data-role="pending-inputs"] li:has-text("{SUPPLEMENT}")')
    phone = phone_view(chromium, procs.base_url, "dana", session_id)

    # Asked first: the approval request is withdrawn, and the addition is kept, not sent.
    for view, size in ((page, "desktop"), (phone, "phone")):
        panel = open_confirmation(view, run)
        text = panel.inner_text()
        assert "Cancel this run?" in text
        assert "The request to approve the refund of 25.00 USD for order 9527 will be withdrawn" in text
        assert f"What you added, “{SUPPLEMENT}”, will be kept for you to send as a new request or drop." in text
        assert "undo" not in text  # nothing was done: nothing alarming
        assert not scrolls_sideways(view)
        screenshot(view, "intent-01-cancel-asks-first-with-a-supplement", size)
    phone.click(f'section#run-{run.pk} [data-role="cancel-no"]')
    assert phone.locator('[data-role="cancel-confirm"]').count() == 0

    # Without JavaScript the same question is a page of its own.
    plain = chromium.new_context(base_url=procs.base_url, viewport=VIEWPORTS["phone"], java_script_enabled=False).new_page()
    login(plain, "/console/login/", "dana")
    plain.goto(f"/console/sessions/{session_id}/")
    plain.click(f'section#run-{run.pk} [data-role="cancel"]')
    plain.wait_for_url(lambda url: f"/console/runs/{run.pk}/cancel/" in url)
    assert "will be withdrawn" in plain.inner_text("main") and not scrolls_sideways(plain)
    screenshot(plain, "intent-01b-cancel-asks-first-without-javascript", "phone")
    plain.click('[data-role="cancel-no"]')
    plain.wait_for_url(lambda url: f"/console/sessions/{session_id}/" in url)
    plain.context.close()
    assert Run.objects.get(pk=run.pk).cancel_requested_at is None  # asking changed nothing

    page.click(f'section#run-{run.pk} [data-role="cancel-yes"]')
    page.wait_for_selector(f'section#run-{run.pk}[data-status="cancelled"]')
    held = page.wait_for_selector(f'[data-role="held-inputs"] [data-held]:has-text("{SUPPLEMENT}")')
    assert "Send as a new request" in held.inner_text() and "Drop it" in held.inner_text()
    phone.wait_for_selector(f'[data-role="held-inputs"] [data-held]:has-text("{SUPPLEMENT}")')
    for view, size in ((page, "desktop"), (phone, "phone")):
        assert not scrolls_sideways(view)
        screenshot(view, "intent-02-cancelled-and-the-supplement-offered-back", size)
    # Nothing started by itself: one run, the supplement held, its text in nobody's history.
    assert list(Run.objects.filter(session_id=session_id).values_list("pk", flat=True)) == [run.pk]
    pending = PendingInput.objects.get(session_id=session_id)
    assert (pending.disposition, pending.held_from_id) == (InputDisposition.HELD, run.pk)
    assert not Message.objects.filter(session_id=session_id, content=SUPPLEMENT).exists()
    assert Approval.objects.get(run=run).status == ApprovalStatus.WITHDRAWN

    # Asked for, it starts exactly one run, with its text.
    page.click(f'[data-held="{pending.pk}"] [data-role="held-send"]')
    page.wait_for_function("() => document.querySelectorAll('section.run').length === 2")
    # The held card goes when the page hears that it was sent (perhaps a moment after the new run shows).
    page.wait_for_function("""() => !document.querySelector('[data-role="held-inputs"] [data-held]')""")
    second = Run.objects.filter(session_id=session_id).exclude(pk=run.pk).get()
    assert Message.objects.filter(run=second, role=MessageRole.USER).get().content == SUPPLEMENT
    page.wait_for_selector(f'section#run-{second.pk}[data-status="completed"]')
    screenshot(page, "intent-03-sent-as-a-new-request", "desktop")
    pending.refresh_from_db()
    assert (pending.disposition, pending.consumed_by_id) == (InputDisposition.NEW_RUN, second.pk)
    assert Run.objects.filter(session_id=session_id).count() == 2


def test_cancelling_a_run_whose_refund_is_on_its_way_asks_first_and_waits_for_the_refund(live_system, chromium,
                                                                                         desk_operator):
    from demo.selectors import sim_refund_count
    from demo.services import sim_fault_set

    procs = live_system
    procs.start_web(simulator=True)
    procs.start_workers(workers=1)
    UserFactory(username="eve")
    page = browser_page(chromium, procs.base_url, "desktop")
    login(page, "/console/login/", "eve")
    session_id = new_session(page, "Refund on its way")
    send(page, REFUND_REQUEST)
    run = waiting_for_approval(session_id)
    page.wait_for_selector(f'section#run-{run.pk}[data-status="waiting"]')

    # The payment service books the refund and answers too late: the write is on its way, then in
    # doubt, until the sweeper (started only after the cancel) reconciles it.
    sim_fault_set(target="refund", mode="timeout_after_booking", delay_seconds=3, count=1)
    approve_pending(desk_operator)
    wait_for(lambda: ToolCall.objects.filter(run=run, tool_name="execute_refund",
                                             status__in=[ToolCallStatus.RUNNING, ToolCallStatus.UNKNOWN]).exists(),
             timeout=60, message="the refund to be on its way")
    phone = phone_view(chromium, procs.base_url, "eve", session_id)

    for view, size in ((page, "desktop"), (phone, "phone")):
        panel = open_confirmation(view, run)
        text = panel.inner_text()
        assert "Cancel this run?" in text
        assert "refund of 25.00 USD for order 9527" in text
        assert "will not undo it" in text  # on its way: cancelling waits for it, never undoes it
        assert "The agent stops working on this request and will not answer it." in text
        assert view.locator(f'section#run-{run.pk} [data-role="cancel-yes"]').is_visible()
        assert view.locator(f'section#run-{run.pk} [data-role="cancel-no"]').is_visible()
        assert not scrolls_sideways(view)
        screenshot(view, "intent-04-cancel-with-a-refund-on-its-way-asks-first", size)
    assert Run.objects.get(pk=run.pk).cancel_requested_at is None  # nothing cancelled before "Yes"
    phone.click(f'section#run-{run.pk} [data-role="cancel-no"]')

    page.click(f'section#run-{run.pk} [data-role="cancel-yes"]')
    wait_for(lambda: Run.objects.filter(pk=run.pk, cancel_requested_at__isnull=False).exists(), timeout=30,
             message="the cancel request")
    procs.start_sweeper()
    page.wait_for_selector(f'section#run-{run.pk}[data-status="cancelled"]')
    effects = page.wait_for_selector(f'section#run-{run.pk} [data-role="effects"]')
    assert "Side effects already applied" in effects.inner_text()
    refund = ToolCall.objects.get(run=run, tool_name="execute_refund")
    assert refund.status == ToolCallStatus.SUCCEEDED and sim_refund_count(order_id="9527") == 1
    phone.wait_for_selector(f'section#run-{run.pk}[data-status="cancelled"]')
    for view, size in ((page, "desktop"), (phone, "phone")):
        screenshot(view, "intent-05-cancelled-after-the-refund-was-made", size)
