"""The desk shows any tool truthfully (SPEC §18), in headless Chromium at 1280×800 and 390×844, with
real workers and the test suite's own tool package (the ledger's credit, in EUR): the queue's row
says what the request is about from the tool's declaration — its reference and counterparty, its
amount with its currency — not "order"; the request's page shows the limit's window with this call
in it and every other call that asked for the same business key."""

import pytest

from approvals_app.models import Approval, AuditEntry, Freeze
from runs_app.models import RunStatus, WaitReason
from tests.e2e.conftest import browser_page, login, screenshot, scrolls_sideways
from tests.support.agents import credit, credit_clerk, tool_modules_setting, wait_for_run
from tests.support.api import HttpApi, grant
from tests.support.factories import UserFactory

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

QUEUE = "/admin/approvals_app/approval/"
DAILY_15 = {"ledger_credit": [{"window": "24h", "per": "customer", "max_amount": "15.00", "over": "operator"}]}


def test_the_queue_and_the_request_say_what_a_ledger_credit_is_with_its_currency_and_the_days_total(
        procs, chromium, tmp_path, monkeypatch):
    monkeypatch.setenv("EXAMPLE_LEDGER_DIR", str(tmp_path / "ledger"))
    procs.base_env |= {"WARDEN_TOOL_MODULES": tool_modules_setting(), "EXAMPLE_LEDGER_DIR": str(tmp_path / "ledger")}
    procs.start_web(simulator=False)
    procs.start_workers(workers=2)
    procs.start_sweeper()
    admin = grant(UserFactory(username="money-admin", is_staff=True), ("agents", "change_agent"))
    operator = grant(UserFactory(username="money-operator", is_staff=True), ("approvals_app", "decide_approval"))
    assert HttpApi(procs.base_url, admin).post("/agents", credit_clerk(
        "desk-clerk", turns=[{"calls": [credit()]}, {"text": "Done."}], limits=DAILY_15)).status_code == 201
    customer = HttpApi(procs.base_url, UserFactory(username="money-customer"))
    runs = {}
    # INV-7 books (9.00); INV-8 would make 18.00 of 15.00 today: an operator decides; then INV-7 and
    # INV-8 are asked for again, each from a session of its own: answered from the first, not booked.
    for label, reference, until in (("first", "INV-7", (RunStatus.COMPLETED, "")),
                                    ("over", "INV-8", (RunStatus.WAITING, WaitReason.APPROVAL)),
                                    ("again-7", "INV-7", (RunStatus.COMPLETED, "")),
                                    ("again-8", "INV-8", (RunStatus.COMPLETED, ""))):
        session = customer.post("/sessions", {"title": reference, "agent": "desk-clerk"}).json()["id"]
        runs[label] = customer.post(f"/sessions/{session}/messages", {"content": reference}).json()["run"]["id"]
        wait_for_run(runs[label], *until)
    approval = Approval.objects.get(run_id=runs["over"])
    again = runs["again-8"]

    for size in ("desktop", "phone"):
        page = browser_page(chromium, procs.base_url, size)
        login(page, f"/admin/login/?next={QUEUE}", operator.username)
        row = page.locator("#result_list tbody tr").filter(has_text="INV-8")
        assert row.count() == 1
        text = row.inner_text()
        assert "reference INV-8 · account acme" in text and "9.00 EUR" in text and "order" not in text
        screenshot(page, "desk-money-queue", size)
        assert not scrolls_sideways(page)

        page.goto(f"{QUEUE}{approval.pk}/change/")
        money = page.inner_text("fieldset:has-text('Money over time')")
        assert "24h" in money and "18.00 EUR" in money and "15.00 EUR" in money
        assert "already_requested" not in money and again[:8] in money  # the other run that asked for INV-8
        screenshot(page, "desk-money-request", size)
        assert not scrolls_sideways(page)
        page.context.close()


def test_an_operator_freezes_a_tool_on_the_desk_sees_it_on_the_dashboard_and_lifts_it(procs, chromium):
    procs.start_web(simulator=False)
    on_call = grant(UserFactory(username="desk-on-call", is_staff=True), ("approvals_app", "freeze_money"))
    for rounds, size in enumerate(("desktop", "phone"), start=1):
        page = browser_page(chromium, procs.base_url, size)
        login(page, "/admin/login/?next=/admin/approvals_app/freeze/add/", on_call.username)
        page.select_option("#id_scope", "tool")
        page.fill("#id_target", "no_such_tool")  # refused on the form, nothing set
        page.fill("#id_reason", "INC-7: payouts misbehave")
        page.click('input[name="_save"]')
        assert "no write tool 'no_such_tool'" in page.inner_text("#content")
        assert not Freeze.objects.filter(lifted_at__isnull=True).exists()
        page.fill("#id_target", "execute_refund")
        page.click('input[name="_save"]')
        page.wait_for_selector("ul.messagelist")
        assert "in force · wait" in page.inner_text("#result_list")

        page.goto("/admin/")
        frozen = page.inner_text("#overview-freezes")
        assert "tool execute_refund · wait" in frozen and "INC-7" in frozen
        screenshot(page, "desk-freeze-dashboard", size)
        assert not scrolls_sideways(page)

        page.goto("/admin/approvals_app/freeze/")
        page.locator("#result_list tbody tr").filter(has_text="in force").locator('input[name="_selected_action"]').check()
        page.select_option('select[name="action"]', "lift_selected")
        page.click('button[name="index"]')
        page.wait_for_selector("ul.messagelist")
        assert "1 freeze lifted" in page.inner_text("ul.messagelist")
        page.goto("/admin/")
        assert "nothing" in page.inner_text("#overview-freezes")
        page.context.close()
        assert [e.action for e in AuditEntry.objects.filter(object_type="freeze").order_by("id")] == ["freeze", "unfreeze"] * rounds
