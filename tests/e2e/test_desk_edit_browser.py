"""Edit on approve at the desk (SPEC §18), in headless Chromium at 390×844 and 1280×800, with real
workers and the test suite's own tool package (the ledger's credit, in EUR): on a phone the edit
page fits and an amount the tool's schema refuses is refused with the field named, nothing changed;
at the desk an operator lowers the credit from 120.00 to 100.00 with a reason — and, a party to it
now, is shown why they may not approve it — and another operator approves it; the ledger books 100.00
once and the customer's console says what was asked and what it is for."""

import pytest

from approvals_app.models import Approval, AuditEntry
from runs_app.models import RunStatus, WaitReason
from tests.e2e.conftest import browser_page, login, screenshot, scrolls_sideways
from tests.support.agents import credit, credit_clerk, tool_modules_setting, wait_for_run
from tests.support.api import HttpApi, grant
from tests.support.example_tools.ledger import ledger_bookings
from tests.support.factories import UserFactory
from tools_app.models import ToolCall

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_an_operator_lowers_a_credit_on_the_desk_approves_it_and_the_customer_sees_what_was_booked(
        procs, chromium, tmp_path, monkeypatch):
    monkeypatch.setenv("EXAMPLE_LEDGER_DIR", str(tmp_path / "ledger"))
    procs.base_env |= {"WARDEN_TOOL_MODULES": tool_modules_setting(), "EXAMPLE_LEDGER_DIR": str(tmp_path / "ledger")}
    procs.start_web(simulator=False)
    procs.start_workers(workers=1)
    procs.start_sweeper()
    admin = grant(UserFactory(username="edit-desk-admin", is_staff=True), ("agents", "change_agent"))
    operator = grant(UserFactory(username="edit-desk-operator", is_staff=True), ("approvals_app", "decide_approval"))
    approver = grant(UserFactory(username="edit-desk-approver", is_staff=True), ("approvals_app", "decide_approval"))
    assert HttpApi(procs.base_url, admin).post("/agents", credit_clerk(
        "desk-edit-clerk", turns=[{"calls": [credit(amount="120.00")]}, {"text": "Done."}])).status_code == 201
    customer_user = UserFactory(username="edit-desk-customer")
    customer = HttpApi(procs.base_url, customer_user)
    session = customer.post("/sessions", {"title": "INV-9", "agent": "desk-edit-clerk"}).json()["id"]
    run = customer.post(f"/sessions/{session}/messages", {"content": "INV-9"}).json()["run"]["id"]
    wait_for_run(run, RunStatus.WAITING, WaitReason.APPROVAL)
    approval = Approval.objects.get(run_id=run)
    change = f"/admin/approvals_app/approval/{approval.pk}/change/"

    phone = browser_page(chromium, procs.base_url, "phone")
    login(phone, f"/admin/login/?next={change}", operator.username)
    phone.click("#edit-link")
    assert phone.input_value("#id_arg_amount") == "120.00" and phone.input_value("#id_arg_reference") == "INV-9"
    phone.fill("#id_arg_amount", "-5")
    phone.fill("#id_reason", "customer agreed to less")
    phone.click("#confirm-edit")
    phone.wait_for_selector("ul.messagelist")
    assert "amount" in phone.inner_text("ul.messagelist") and "schema" in phone.inner_text("ul.messagelist")
    screenshot(phone, "desk-edit-refused", "phone")
    assert not scrolls_sideways(phone)
    assert ToolCall.objects.get(pk=approval.tool_call_id).arguments["amount"] == "120.00"
    phone.context.close()

    desk = browser_page(chromium, procs.base_url, "desktop")
    login(desk, f"/admin/login/?next={change}", operator.username)
    desk.click("#edit-link")
    desk.fill("#id_arg_amount", "100.00")
    desk.click("#confirm-edit")  # no reason yet: the browser asks for one, nothing is sent
    assert desk.evaluate("document.querySelector('#id_reason').validity.valueMissing")
    assert ToolCall.objects.get(pk=approval.tool_call_id).proposed_arguments is None
    desk.fill("#id_reason", "goodwill capped at 100.00 (case 91)")
    desk.click("#confirm-edit")
    desk.wait_for_selector("ul.messagelist")
    assert "Changed: ledger_credit" in desk.inner_text("ul.messagelist")
    assert "100.00 EUR" in desk.inner_text("ul.messagelist")
    screenshot(desk, "desk-edit-saved", "desktop")
    assert "you edited this request" in desk.inner_text("#barred-reason") and desk.locator("#approve-link").count() == 0
    desk.context.close()

    desk = browser_page(chromium, procs.base_url, "desktop")
    login(desk, f"/admin/login/?next={change}", approver.username)
    assert "the model asked: amount=120.00, account=acme" in desk.inner_text("#asked-arguments")
    desk.click("#approve-link")
    desk.click("#confirm-decision")
    desk.wait_for_selector("ul.messagelist")
    wait_for_run(run, RunStatus.COMPLETED)
    (booking,) = ledger_bookings()
    assert booking["amount"] == "100.00"
    (entry,) = AuditEntry.objects.filter(action="edit")
    assert entry.before["arguments"]["amount"] == "120.00" and entry.after["arguments"]["amount"] == "100.00"
    desk.context.close()

    console = browser_page(chromium, procs.base_url, "phone")
    login(console, "/console/login/", customer_user.username)
    console.goto(f"/console/sessions/{session}/")
    edited = console.locator('[data-role="edited"]').first
    edited.wait_for()
    assert "120.00 EUR was asked, 100.00 EUR is what it is for" in edited.inner_text()
    screenshot(console, "console-edited-credit", "phone")
    assert not scrolls_sideways(console)
    console.context.close()
