"""The operators' desk in headless Chromium, at 1280×800 and 390×844, against the real system
(daphne, django-q2 workers, the sweeper, the simulated payment gateway): the queue's Approve
button in view, search by order number, the dashboard's charts, a bulk approval of three
refunds booked by real workers, and the demo buttons that make reconciliation need a person.
Screenshots of every page at both sizes go to test-artifacts/screenshots/."""

import pytest
from django.contrib.auth.models import Permission

from approvals_app.models import Approval, ApprovalStatus, AuditEntry
from engine.actions.messages import message_post
from runs_app.models import Run, RunOutcome, RunStatus, WaitReason
from engine.actions.sessions import session_open
from tests.e2e.conftest import browser_page, inside_viewport_horizontally, login, screenshot, scrolls_sideways
from tests.support.factories import UserFactory
from tests.support.processes import wait_for
from demo.selectors import sim_refund_count
from tools_app.models import Resolution, ToolCall, ToolCallStatus

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

QUEUE = "/admin/approvals_app/approval/"
RUNS = "/admin/runs_app/run/"
BULK_ORDERS = ["9534", "9535", "9536"]


def refunds_waiting(customer, orders: list[str]) -> list[Run]:
    """The customer asks for each refund in a session of its own; returns once every run waits
    for its operator."""
    runs = []
    for order in orders:
        session = session_open(owner=customer, title=f"Refund for order {order}")
        runs.append(message_post(session=session, content=f"Check order {order} and refund it if it's eligible",
                                 acting_user=customer).run)
    wait_for(lambda: Run.objects.filter(pk__in=[r.pk for r in runs], status=RunStatus.WAITING,
                                        wait_reason=WaitReason.APPROVAL).count() == len(runs),
             timeout=90, message="every run to wait for its approval")
    return runs


def approval_of(run: Run) -> Approval:
    return Approval.objects.get(run=run, status=ApprovalStatus.PENDING)


def look_at_every_desk_page(page, size: str, *, run: Run) -> None:
    for path, name in [("/admin/", "desk-dashboard"), (QUEUE, "desk-approval-queue"), (RUNS, "desk-runs"),
                       (f"{RUNS}{run.pk}/change/", "desk-run-detail"), ("/admin/tools_app/unknowntoolcall/", "desk-unknown-calls"),
                       ("/admin/approvals_app/auditentry/", "desk-audit-trail"), ("/admin/sessions_app/session/", "desk-sessions")]:
        page.goto(path)
        assert not scrolls_sideways(page), f"{path} scrolls sideways at {size}"
        assert not overlapping_cells(page), f"{path}: cells of a row overlap at {size}: {overlapping_cells(page)}"
        screenshot(page, name, size)


def overlapping_cells(page) -> list[str]:
    """Cells of a list row whose content spills over their neighbours (on a phone the rows are
    grids of labelled cells, and a grid meant for a checkbox column squeezed a run's id under
    its customer): content wider than its cell."""
    return page.evaluate("""() => [...document.querySelectorAll('#result_list tbody td, #result_list tbody th')]
        .filter(cell => cell.getBoundingClientRect().width > 0 && cell.scrollWidth > cell.clientWidth + 1)
        .map(cell => cell.className + ': ' + cell.textContent.trim().slice(0, 30))""")


def test_the_desk_at_1280_and_390_queue_search_dashboard_and_a_bulk_approval(live_system, chromium, desk_operator):
    procs = live_system
    procs.start_web(simulator=True)
    procs.start_workers(workers=2)
    procs.start_sweeper()
    customer = UserFactory(username="alice")
    runs = refunds_waiting(customer, BULK_ORDERS)
    oldest = min((approval_of(run) for run in runs), key=lambda approval: approval.requested_at)
    by_order = dict(zip(BULK_ORDERS, runs))

    for size in ("phone", "desktop"):
        page = browser_page(chromium, procs.base_url, size)
        login(page, "/admin/login/?next=/admin/", desk_operator.username)

        # The dashboard draws its charts from the demo data: bars of the runs just made, their tokens.
        page.wait_for_selector("#desk-charts")
        assert page.locator("#desk-charts svg.desk-chart").count() >= 5
        assert page.locator("#chart-runs-per-hour rect").count() > 0
        assert page.locator("#chart-tokens-per-day rect").count() > 0
        assert page.locator("#chart-cost-per-day rect").count() > 0
        assert page.inner_text("#overview-pending-approvals .desk-number") == "3"

        # The queue: the oldest request's Approve button is in view without scrolling sideways.
        page.goto(QUEUE)
        approve = f'a[href="{QUEUE}{oldest.pk}/approve/"]'
        rows = page.locator("#result_list tbody tr")
        assert rows.first.locator(approve).count() == 1, (  # oldest first
            f"the first row is not the oldest request ({oldest.pk}, {oldest.requested_at}): "
            f"{[rows.nth(i).inner_text() for i in range(rows.count())] or page.content()[:3000]}")
        assert page.is_visible(approve)
        assert inside_viewport_horizontally(page, approve), page.locator(approve).bounding_box()
        assert not scrolls_sideways(page)
        assert "order 9534" in page.inner_text("#result_list") and "four eyes" in page.inner_text("#result_list")

        # Search by order number finds its run (through the tool call's arguments).
        page.goto(RUNS)
        page.fill("#searchbar", "9535")
        page.press("#searchbar", "Enter")
        page.wait_for_url("**q=9535**")
        rows = page.locator("#result_list tbody tr")
        assert rows.count() == 1 and str(by_order["9535"].pk)[:8] in rows.first.inner_text()
        screenshot(page, "desk-search-by-order", size)

        look_at_every_desk_page(page, size, run=by_order["9534"])

        # The pages a decision goes through, looked at (not confirmed) at this size: one request's
        # approve and reject pages, and the bulk confirmation of all three.
        for verb in ("approve", "reject"):
            page.goto(f"{QUEUE}{oldest.pk}/{verb}/")
            page.wait_for_selector("#decide-form")
            screenshot(page, f"desk-{verb}-one-request", size)
            assert page.is_visible("#confirm-decision") and inside_viewport_horizontally(page, "#confirm-decision")
            assert not scrolls_sideways(page), f"the {verb} page scrolls sideways at {size}"
        page.goto(QUEUE)
        for run in runs:
            page.check(f'input[name="_selected_action"][value="{approval_of(run).pk}"]')
        page.select_option('select[name="action"]', "approve_selected")
        page.click('button[name="index"]')
        page.wait_for_selector("#decide-form")
        assert page.locator("#bulk-rows tbody tr").count() == 3
        screenshot(page, "desk-bulk-approve-confirmation", size)
        assert inside_viewport_horizontally(page, "#confirm-decision") and not scrolls_sideways(page)
        page.context.close()
    assert Approval.objects.filter(pk__in=[approval_of(run).pk for run in runs], status=ApprovalStatus.PENDING).count() == 3

    # A bulk approval of the three refunds, each decided (and audited) on its own, booked by the workers.
    page = browser_page(chromium, procs.base_url, "desktop")
    login(page, f"/admin/login/?next={QUEUE}", desk_operator.username)
    for run in runs:
        page.check(f'input[name="_selected_action"][value="{approval_of(run).pk}"]')
    page.select_option('select[name="action"]', "approve_selected")
    page.click('button[name="index"]')
    page.wait_for_selector("#decide-form")
    assert page.locator("#bulk-rows tbody tr").count() == 3
    page.fill("#id_note", "Orders 9534–9536 checked: delivered, eligible.")
    screenshot(page, "desk-bulk-approve-confirmation", "desktop")
    page.click("#confirm-decision")
    page.wait_for_selector("ul.messagelist")
    assert "3 requests — Approved" in page.inner_text("ul.messagelist")
    screenshot(page, "desk-bulk-approved", "desktop")

    wait_for(lambda: Run.objects.filter(pk__in=[r.pk for r in runs], status=RunStatus.COMPLETED).count() == 3,
             timeout=120, message="the three runs to complete")
    assert [sim_refund_count(order_id=order) for order in BULK_ORDERS] == [1, 1, 1]
    assert set(Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("outcome", flat=True)) == {RunOutcome.APPLIED}
    decisions = AuditEntry.objects.filter(action="approve", actor=desk_operator)
    assert decisions.count() == 3 and {e.run_id for e in decisions} == {r.pk for r in runs}

    # The finished run's page: its outcome, applied effect and timeline at the top, at both sizes.
    for size in ("desktop", "phone"):
        page = browser_page(chromium, procs.base_url, size)
        login(page, f"/admin/login/?next={RUNS}{runs[0].pk}/change/", desk_operator.username)
        assert "Effects applied" in page.inner_text("#run-summary")
        assert "execute_refund" in page.inner_text("#run-effects")
        assert page.locator("#run-summary .timeline svg").count() == 1
        assert not scrolls_sideways(page)
        screenshot(page, "desk-run-detail-completed", size)
        page.context.close()


def test_demo_buttons_make_reconciliation_need_a_person_who_settles_it_on_the_desk(procs, demo_world, chromium, desk_operator):
    """Demo mode, the simulated gateway on its own port: the desk's buttons arm "time out after
    booking" and "lookups unavailable"; the refund ends up unknown and stays unknown (no lookup
    answers), waiting in the queue; the operator records it as applied with evidence."""
    procs.base_env["WARDEN_DEMO"] = "1"
    procs.start_web(simulator=True)
    procs.start_workers(workers=2)
    procs.start_sweeper()
    desk_operator.user_permissions.add(Permission.objects.get(codename="change_simfault"))
    (run,) = refunds_waiting(UserFactory(username="alice"), ["9532"])

    page = browser_page(chromium, procs.base_url, "desktop")
    login(page, "/admin/login/?next=/admin/", desk_operator.username)
    page.click("#demo-lookups_unavailable")
    assert "Armed: Lookups unavailable" in page.inner_text("ul.messagelist")
    page.click("#demo-timeout_after_booking")
    assert "Armed: Next refund: time out after booking" in page.inner_text("ul.messagelist")
    assert "lookup: error before booking (until cleared)" in page.inner_text("ul.messagelist")
    screenshot(page, "desk-demo-faults-armed", "desktop")
    assert AuditEntry.objects.filter(action="demo_fault_arm", actor=desk_operator).count() == 2

    page.goto(f"{QUEUE}{approval_of(run).pk}/approve/")
    page.click("#confirm-decision")
    refund = ToolCall.objects.get(run=run, tool_name="execute_refund")
    wait_for(lambda: ToolCall.objects.filter(pk=refund.pk, status=ToolCallStatus.UNKNOWN, reconcile_attempts__gte=1).exists(),
             timeout=90, message="the refund to be unknown, and a lookup to have failed")

    for size in ("phone", "desktop"):
        desk = browser_page(chromium, procs.base_url, size)
        login(desk, "/admin/login/?next=/admin/tools_app/unknowntoolcall/", desk_operator.username)
        record = f'a[href="/admin/tools_app/unknowntoolcall/{refund.pk}/resolve/"]'
        assert desk.is_visible(record) and inside_viewport_horizontally(desk, record)
        assert not scrolls_sideways(desk)
        screenshot(desk, "desk-unknown-call-waiting-for-a-person", size)
        if size == "phone":
            desk.click(record)  # the record-outcome form, looked at on a phone (not sent)
            desk.wait_for_selector("#confirm-outcome")
            assert inside_viewport_horizontally(desk, "#confirm-outcome") and not scrolls_sideways(desk)
            screenshot(desk, "desk-record-outcome", "phone")
            desk.context.close()
    desk.click(record)
    desk.check('input[name="outcome"][value="applied"]')
    desk.fill("#id_evidence", "Gateway dashboard: refund of 48.00 USD for order 9532 booked under our key.")
    screenshot(desk, "desk-record-outcome", "desktop")
    desk.click("#confirm-outcome")
    assert "was applied" in desk.inner_text("ul.messagelist")

    wait_for(lambda: Run.objects.filter(pk=run.pk, status=RunStatus.COMPLETED).exists(), timeout=90, message="the run to complete")
    refund.refresh_from_db()
    assert (refund.status, refund.resolution, refund.resolved_by) == (ToolCallStatus.SUCCEEDED, Resolution.APPLIED, desk_operator)
    assert sim_refund_count(order_id="9532") == 1  # booked once, by the request that timed out
    assert Run.objects.get(pk=run.pk).outcome == RunOutcome.APPLIED

    desk.goto("/admin/")
    desk.click("#demo-clear")
    assert "Demo faults cleared" in desk.inner_text("ul.messagelist")
    assert AuditEntry.objects.filter(action="demo_fault_clear", actor=desk_operator).exists()
