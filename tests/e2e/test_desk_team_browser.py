"""The desk worked by a team on shift (issue 29), in headless Chromium at 1280×800 and 390×844
against the real web server: an operator assigns three requests to themselves, filters to "mine",
approves one with the keyboard alone (j, x, a, then Enter on the confirmation page — the same
form a click sends), exports the decided list as CSV whose rows are the page's rows; a second
operator sees the three as assigned. The dashboard's counts and the pages are looked at, at both
sizes (test-artifacts/screenshots/desk-team-*)."""

import csv

import pytest

from approvals_app.models import Approval, ApprovalStatus, AuditEntry
from runs_app.models import WaitReason
from tests.e2e.conftest import browser_page, inside_viewport_horizontally, login, screenshot, scrolls_sideways
from tests.support.desk import refund_scene, staff_user
from tests.support.factories import ApprovalFactory, UserFactory
from tools_app.models import ToolCallStatus

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

QUEUE = "/admin/approvals_app/approval/"


def pending_refunds(count: int) -> list[Approval]:
    """Refunds waiting for an operator, built as the engine leaves them (no worker needed to decide)."""
    customer = UserFactory(username="alice")
    approvals = []
    for _ in range(count):
        scene = refund_scene(owner=customer, wait_reason=WaitReason.APPROVAL, refund_status=ToolCallStatus.PENDING)
        approvals.append(ApprovalFactory(tool_call=scene.refund, run=scene.run))
    return approvals


def list_fits(page) -> tuple[int, int]:
    """(width the queue's table needs, width it has): every column in view, none scrolled away."""
    return tuple(page.evaluate("""() => { const box = document.querySelector('#changelist .results');
        return [box.scrollWidth, box.clientWidth]; }"""))


def row_cells(page, column: str) -> list[str]:
    return [" ".join(text.split()) for text in page.locator(f"#result_list tbody .field-{column}").all_inner_texts()]


def test_an_operator_assigns_three_approves_one_by_keyboard_exports_the_decided_list_and_a_colleague_sees_them(
        procs, chromium):
    procs.start_web()
    first = staff_user("op1", "decide_approval")
    second = staff_user("op2", "decide_approval")
    mine, other = pending_refunds(3), pending_refunds(1)

    page = browser_page(chromium, procs.base_url, "desktop")
    login(page, f"/admin/login/?next={QUEUE}", first.username)
    page.wait_for_selector("#queue-keys-hint", state="visible")
    assert "j/k move" in page.inner_text("#queue-keys-hint")
    for approval in mine:
        page.check(f'input[name="_selected_action"][value="{approval.pk}"]')
    page.select_option('select[name="action"]', "assign_to_me")
    page.click('button[name="index"]')
    page.wait_for_selector("ul.messagelist")
    assert "3 requests assigned to you." in page.inner_text("ul.messagelist")
    assert set(Approval.objects.filter(assigned_to=first).values_list("pk", flat=True)) == {a.pk for a in mine}

    page.click("#view-mine")
    page.wait_for_url("**assigned=mine**")
    assert page.locator("#result_list tbody tr").count() == 3
    assert row_cells(page, "assigned") == ["you"] * 3
    screenshot(page, "desk-team-queue-mine", "desktop")
    assert not scrolls_sideways(page)
    needed, has = list_fits(page)
    assert needed <= has + 1, (f"the queue's columns need {needed} px of {has}: the last ones scroll out of view",
                               page.evaluate("() => [...document.querySelectorAll('#result_list thead th')].map("
                                             "th => th.className.split(' ').pop() + ':' + Math.round(th.getBoundingClientRect().width)).join(' ')"))

    # The keyboard alone: the first request, its box ticked, approve — the confirmation page — Enter.
    page.keyboard.press("?")
    page.wait_for_selector("#queue-keys-help", state="visible")
    page.keyboard.press("Escape")
    page.keyboard.press("j")
    page.wait_for_selector("#result_list tbody tr.desk-key-current")
    chosen = page.locator("#result_list tbody tr.desk-key-current input.action-select").get_attribute("value")
    page.keyboard.press("x")
    assert page.is_checked(f'input.action-select[value="{chosen}"]')
    page.keyboard.press("a")
    page.wait_for_selector("#decide-form")
    assert page.locator("#bulk-rows tbody tr").count() == 1
    # The page's script writes the hint once it has run: the form may be there before it.
    page.wait_for_selector("#queue-keys-hint", state="visible")
    assert "Enter confirms" in page.inner_text("#queue-keys-hint")
    screenshot(page, "desk-team-keyboard-confirmation", "desktop")
    page.keyboard.press("Enter")
    page.wait_for_selector("ul.messagelist")
    assert "Approved: execute_refund" in page.inner_text("ul.messagelist"), page.inner_text("ul.messagelist")
    decided = Approval.objects.get(pk=chosen)
    assert (decided.status, decided.decided_by, decided.assigned_to) == (ApprovalStatus.APPROVED, first, first)
    assert AuditEntry.objects.filter(action="approve", actor=first, object_id=chosen).count() == 1

    # The decided list (mine, approved), and its CSV: the same rows, in the same order.
    page.goto(f"{QUEUE}?assigned=mine&status__exact=approved")
    assert page.locator("#result_list tbody tr").count() == 1
    with page.expect_download() as download:
        page.click("#export-csv")
    with open(download.value.path(), newline="", encoding="utf-8") as exported:
        rows = list(csv.reader(exported))
    header, body = rows[0], rows[1:]
    assert len(body) == page.locator("#result_list tbody tr").count()
    for column, title in [("customer", "customer"), ("amount", "amount"), ("status_badge", "status")]:
        assert [row[header.index(title)] for row in body] == row_cells(page, column), column
    assert [row[header.index("request")] for row in body] == [
        " · ".join(line.strip() for line in text.splitlines() if line.strip())
        for text in page.locator("#result_list tbody th.field-order").all_inner_texts()]
    assert [row[header.index("assigned")] for row in body] == ["op1"]
    export = AuditEntry.objects.get(action="export", actor=first)
    assert export.after["rows"] == 1 and export.after["filters"] == {"assigned": "mine", "status__exact": "approved"}
    screenshot(page, "desk-team-decided-mine", "desktop")
    page.context.close()

    # The second operator sees the three in the first one's hands, and the fourth in nobody's.
    for size in ("desktop", "phone"):
        colleague = browser_page(chromium, procs.base_url, size)
        login(colleague, f"/admin/login/?next={QUEUE}?status__exact=all", second.username)
        assigned = dict(zip(colleague.locator("#result_list tbody input.action-select").evaluate_all(
            "boxes => boxes.map(box => box.value)"), row_cells(colleague, "assigned")))
        assert assigned == {**{str(a.pk): "op1" for a in mine}, str(other[0].pk): "—"}
        assert not scrolls_sideways(colleague), size
        screenshot(colleague, "desk-team-colleague-queue", size)
        colleague.context.close()

    # The dashboard's counts, and the pages of the scene on a phone.
    for size in ("desktop", "phone"):
        page = browser_page(chromium, procs.base_url, size)
        login(page, "/admin/login/?next=/admin/", first.username)
        page.wait_for_selector("#pending-counts")
        assert page.inner_text('#pending-by-assignee a[data-assigned="mine"]') == "2"
        assert page.inner_text('#pending-by-tier a[data-tier="operator"]') == "3"
        page.locator("#pending-counts").scroll_into_view_if_needed()
        screenshot(page, "desk-team-dashboard", size)
        assert not scrolls_sideways(page), size
        page.click('#pending-by-assignee a[data-assigned="mine"]')
        page.wait_for_url("**assigned=mine**")
        assert page.locator("#result_list tbody tr").count() == 2
        assert page.is_visible("#export-csv") and inside_viewport_horizontally(page, "#export-csv")
        assert not scrolls_sideways(page), size
        screenshot(page, "desk-team-queue-mine-from-dashboard", size)
        for approval in mine[1:]:
            page.check(f'input[name="_selected_action"][value="{approval.pk}"]')
        page.select_option('select[name="action"]', "assign_to")
        page.click('button[name="index"]')
        page.wait_for_selector("#assign-form")
        assert not scrolls_sideways(page), size
        screenshot(page, "desk-team-assign-to", size)
        page.context.close()
