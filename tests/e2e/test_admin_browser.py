"""In headless Chromium: an operator logs into the admin, opens the approval queue, approves the
refund on its confirmation page with a note, and watches the run complete (real workers).

The browser is Debian's `chromium`, driven by Playwright through `executable_path` (no browser
download). While Playwright's sync API is active its event loop counts as running in this
thread, so the Django ORM is used only before and after the browser session."""

import os
import shutil
import time
from pathlib import Path

import pytest

from approvals_app.models import ApprovalStatus
from runs_app.models import Run, RunStatus
from tests.e2e.conftest import refund_waiting_for_approval, run_finished
from tests.support.factories import TEST_PASSWORD
from tests.support.processes import ROOT, wait_for
from demo.selectors import sim_refund_count

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"


@pytest.fixture
def chromium_path() -> str:
    path = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed; .ci/run installs it (apt-get install chromium)")
    pytest.skip("chromium is not installed locally (apt-get install -y chromium); CI installs it and never skips")


def shot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def wait_for_page_text(page, url: str, selector: str, text: str, *, timeout: float = 90) -> None:
    """Reload `url` until `selector` shows `text`, as an operator refreshing the page would."""
    deadline = time.monotonic() + timeout
    while True:
        page.goto(url)
        if text in page.inner_text(selector):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{url}: {selector} never showed {text!r}; last: {page.inner_text(selector)!r}")
        time.sleep(0.5)


def test_operator_approves_a_refund_in_headless_chromium_and_the_run_completes(procs, demo_world, desk_operator, chromium_path):
    from playwright.sync_api import expect, sync_playwright

    procs.start_web(simulator=True)
    procs.start_workers(workers=2)
    procs.start_sweeper()
    run, approval = refund_waiting_for_approval()
    base = procs.base_url
    run_page = f"{base}/admin/runs_app/run/{run.pk}/change/"

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(30_000)
            page.goto(f"{base}/admin/")
            page.fill("#id_username", desk_operator.username)
            page.fill("#id_password", TEST_PASSWORD)
            shot(page, "admin-01-login")
            page.click("input[type=submit]")
            expect(page.locator("#desk-overview")).to_be_visible()
            expect(page.locator("#overview-pending-approvals .desk-number")).to_have_text("1")
            shot(page, "admin-02-index-overview")

            page.click("#overview-pending-approvals")
            expect(page.locator("#result_list")).to_contain_text("execute_refund")
            shot(page, "admin-03-approval-queue")

            page.click(f"#result_list a[href*='/approvals_app/approval/{approval.pk}/change/']")
            expect(page.locator("body")).to_contain_text("Check order 9527 and refund it")  # the conversation
            expect(page.locator("body")).to_contain_text("refund_eligible")  # the order, from query_order
            shot(page, "admin-04-approval-detail")

            page.click("#approve-link")
            expect(page.locator("#decide-form")).to_be_visible()
            page.fill("#id_note", "Order 9527 checked: delivered, eligible, 25.00 USD.")
            shot(page, "admin-05-approve-confirmation")
            page.click("#confirm-decision")
            expect(page.locator("ul.messagelist")).to_contain_text("Approved: execute_refund")
            shot(page, "admin-06-approved")

            wait_for_page_text(page, run_page, ".field-status .readonly", "Completed")
            expect(page.locator("#run-effects")).to_contain_text("execute_refund")
            shot(page, "admin-07-run-completed")
        finally:
            browser.close()

    wait_for(lambda: run_finished(run.pk), timeout=10, message="the run to be finished")
    stored = Run.objects.get(pk=run.pk)
    assert stored.status == RunStatus.COMPLETED, (stored.error_code, stored.error_detail)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and approval.decided_by == desk_operator
    assert approval.note == "Order 9527 checked: delivered, eligible, 25.00 USD."
    assert sim_refund_count(order_id="9527") == 1
    for name in ("admin-02-index-overview", "admin-05-approve-confirmation", "admin-07-run-completed"):
        assert (SCREENSHOTS / f"{name}.png").stat().st_size > 0
