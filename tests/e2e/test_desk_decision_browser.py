"""The pages where a write is decided (issue 29), in headless Chromium at 1280×800 and 390×844 against
the real web server: approve, reject and record-outcome use the whole width at 1280 — the page body
is as wide as the viewport less the admin's margins, the request beside its conversation — and show
the customer's request, the limit windows' totals and the earlier call with the same business key;
Confirm and "No, take me back" are one height and one line; nothing scrolls sideways on a phone. The
desk's home puts the operators' work first and the internals under "Administration" (superusers)."""

import pytest

from agents.selectors import tool_call_limit_windows
from runs_app.models import WaitReason
from tests.e2e.conftest import browser_page, login, screenshot, scrolls_sideways
from tests.support.desk import REFUND_LIMITS, refund_clerk, refund_scene_with_history
from tests.support.factories import ApprovalFactory, UserFactory
from tools_app.models import ToolCallStatus

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

MEASURE = """() => {
  const content = getComputedStyle(document.querySelector('#content'));
  const box = (selector) => { const r = document.querySelector(selector).getBoundingClientRect();
                              return {left: r.left, right: r.right, top: r.top, width: r.width}; };
  return {viewport: document.documentElement.clientWidth,
          margins: parseFloat(content.paddingLeft) + parseFloat(content.paddingRight),
          main: box('#content-main'), facts: box('.desk-decision-facts'), context: box('.desk-decision-context')};
}"""


def _boxes_line_up(page, confirm: str, size: str) -> None:
    ok, back = page.locator(confirm).bounding_box(), page.locator("#take-me-back").bounding_box()
    assert abs(ok["height"] - back["height"]) <= 0.5, (ok, back)
    if size == "desktop":  # side by side: one top, one bottom
        assert abs(ok["y"] - back["y"]) <= 0.5 and back["x"] > ok["x"] + ok["width"], (ok, back)
    else:  # stacked on a phone: one left edge, one width
        assert abs(ok["x"] - back["x"]) <= 0.5 and abs(ok["width"] - back["width"]) <= 0.5 and back["y"] > ok["y"], (ok, back)


def test_the_decision_pages_use_the_width_show_what_the_decision_needs_and_line_up_their_buttons(
        procs, chromium, desk_operator):
    procs.start_web(simulator=False)
    customer = UserFactory(username="alice")
    version = refund_clerk(by=UserFactory(username="agent-admin", is_staff=True), limits=REFUND_LIMITS)
    pending = refund_scene_with_history(owner=customer, version=version, wait_reason=WaitReason.APPROVAL,
                                        refund_status=ToolCallStatus.PENDING)
    approval = ApprovalFactory(tool_call=pending.refund, run=pending.run)
    unknown = refund_scene_with_history(owner=customer, version=version, wait_reason=WaitReason.RECONCILIATION,
                                        refund_status=ToolCallStatus.UNKNOWN)
    pages = {
        "approve": (f"/admin/approvals_app/approval/{approval.pk}/approve/", "#confirm-decision", pending),
        "reject": (f"/admin/approvals_app/approval/{approval.pk}/reject/", "#confirm-decision", pending),
        "record-outcome": (f"/admin/tools_app/unknowntoolcall/{unknown.refund.pk}/resolve/", "#confirm-outcome", unknown),
    }
    for size in ("desktop", "phone"):
        page = browser_page(chromium, procs.base_url, size)
        login(page, "/admin/login/?next=/admin/", desk_operator.username)
        for name, (path, confirm, scene) in pages.items():
            page.goto(path)
            page.wait_for_selector(confirm)
            screenshot(page, f"desk-decision-{name}", size)
            assert "Check order 9527 and refund it if it's eligible" in page.inner_text("#customer-request")
            limits = page.inner_text("#limit-windows")
            (day, _) = tool_call_limit_windows(tool_call=scene.refund)  # two scenes: the day's total holds both
            assert "24h" in limits and f"{day.total} USD" in limits and "30.00 USD" in limits and "over" in limits, limits
            assert str(scene.same_key.pk)[:8] in page.inner_text("#same-key-calls")
            assert "Order 9527 is eligible; refunding it." in page.inner_text("#conversation")
            _boxes_line_up(page, confirm, size)
            measured = page.evaluate(MEASURE)
            # The page body fills the viewport but for the admin's own margins.
            assert measured["main"]["width"] >= measured["viewport"] - measured["margins"] - 1, (name, size, measured)
            if size == "desktop":
                # Wide enough for two columns: the request and its money beside the conversation.
                assert measured["context"]["left"] >= measured["facts"]["right"], (name, measured)
                assert abs(measured["context"]["top"] - measured["facts"]["top"]) <= 1, (name, measured)
            else:
                assert not scrolls_sideways(page), name
        page.context.close()


def test_the_desks_home_puts_the_operators_work_first_and_internals_under_administration(procs, chromium, desk_operator):
    procs.start_web(simulator=False)
    root = UserFactory(username="desk-root", is_staff=True, is_superuser=True)
    ApprovalFactory()
    for size in ("desktop", "phone"):
        page = browser_page(chromium, procs.base_url, size)
        login(page, "/admin/login/?next=/admin/", root.username)
        heading = page.locator("#desk-administration")
        assert heading.is_visible() and heading.inner_text().lower() == "administration"
        operators = page.locator("#desk-section-operators").bounding_box()
        internals = page.locator("#desk-section-administration")
        assert internals.bounding_box()["y"] > heading.bounding_box()["y"] > operators["y"]
        text = internals.inner_text()
        assert "Access attempts" in text and "Idempotency records" in text and "Process heartbeats" in text
        assert "Approvals" in page.inner_text("#desk-section-operators")
        screenshot(page, "desk-index-superuser", size)
        assert not scrolls_sideways(page)
        page.context.close()

        page = browser_page(chromium, procs.base_url, size)
        login(page, "/admin/login/?next=/admin/", desk_operator.username)
        assert page.locator("#desk-administration").count() == 0
        assert "Process heartbeats" not in page.inner_text("#content")
        # The whole phrase is the link: a click on its words opens the queue.
        phrase = page.locator("#overview-pending-approvals")
        assert " ".join(phrase.inner_text().split()) == "1 pending approval"
        words = phrase.bounding_box()  # the number on top, the words below it: click the words
        page.mouse.click(words["x"] + 10, words["y"] + words["height"] - 5)
        page.wait_for_url("**/admin/approvals_app/approval/?status__exact=pending")
        page.go_back()
        page.wait_for_selector("#desk-overview")
        screenshot(page, "desk-index-operator", size)
        assert not scrolls_sideways(page)
        page.context.close()
