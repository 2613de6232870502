"""A business key is a fact of the deployment (SPEC §18), through real worker processes and the real
HTTP API, with the test suite's own tool package (tests/support/example_tools/ledger.py, whose
credit's key is "credit:<account>:<reference>"): the same credit asked for by a second message of
the session, by a fork of its run, by another customer's session and by a retried run books once at
the ledger; each
later run completes, its call answered with the first one's outcome and linked to it."""

import pytest

from runs_app.models import Run, RunErrorCode, RunStatus
from sessions_app.models import Message, MessageRole
from tests.support.agents import tool_modules_setting, wait_for_run
from tests.support.api import HttpApi, grant
from tests.support.example_tools.ledger import ledger_bookings
from tests.support.factories import UserFactory
from tools_app.models import ToolCall, ToolCallStatus
from tools_app.outcomes import ALREADY_DONE, ALREADY_DONE_TEXT

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

def payout_clerk(reference: str) -> dict:
    """An agent whose model asks for the same settlement in every run; " globex" is globex (the
    tool's schema strips it before the key is made)."""
    return {
        "name": f"Payout clerk {reference}",
        "instructions": "Settle what the customer asks.",
        "provider": "scripted",
        "tools": ["ledger_balance", "ledger_credit"],
        "approval_rules": {"ledger_credit": [{"when": "always", "approval": "none"}]},
        "provider_options": {"turns": [
            {"calls": [{"name": "ledger_credit", "arguments": {"account": " globex", "amount": "8.00", "reference": reference}}]},
            {"text": f"Settled {reference} for globex: 8.00."},
        ]},
    }


def _post(api: HttpApi, session_id: str, **body) -> str:
    posted = api.post(f"/sessions/{session_id}/messages", {"content": "Settle SET-2 for globex: 8.00", **body})
    assert posted.status_code == 201, posted.text
    return posted.json()["run"]["id"]


def _credit_of(api: HttpApi, run_id: str) -> dict:
    detail = api.get(f"/runs/{run_id}")
    assert detail.status_code == 200, detail.text
    (credit,) = [c for c in detail.json()["tool_calls"] if c["tool_name"] == "ledger_credit"]
    return credit


def test_one_settlement_books_once_whichever_run_session_or_retry_asks_again(procs, tmp_path, monkeypatch):
    ledger = tmp_path / "ledger"
    monkeypatch.setenv("EXAMPLE_LEDGER_DIR", str(ledger))  # this process reads the workers' ledger
    procs.base_env |= {"WARDEN_TOOL_MODULES": tool_modules_setting(), "EXAMPLE_LEDGER_DIR": str(ledger)}
    procs.start_web(simulator=False)
    procs.start_workers(workers=2)
    procs.start_sweeper()
    definer = grant(UserFactory(username="payout-admin", is_staff=True), ("agents", "change_agent"))
    globex, other = UserFactory(username="globex-clerk"), UserFactory(username="second-clerk")
    admin_api, globex_api, other_api = (HttpApi(procs.base_url, user) for user in (definer, globex, other))
    for reference in ("SET-2", "SET-3"):
        assert admin_api.post("/agents", payout_clerk(reference)).status_code == 201
    session = globex_api.post("/sessions", {"title": "settlements", "agent": "payout-clerk-set-2"}).json()["id"]

    # The first message books the settlement.
    first = _post(globex_api, session)
    wait_for_run(first, RunStatus.COMPLETED)
    original = _credit_of(globex_api, first)
    assert original["status"] == ToolCallStatus.SUCCEEDED and original["business_key"] == "ledger_credit:credit:globex:SET-2"
    assert original["idempotency_key"] == original["business_key"] and original["reused_from"] is None
    assert original["money"] == "8.00 EUR"  # the amount with the currency the tool declares
    assert [(b["account"], b["amount"], b["reference"]) for b in ledger_bookings()] == [("globex", "8.00", "SET-2")]

    # The same message again, in the same session: a second run, which does not book again.
    second = _post(globex_api, session)
    wait_for_run(second, RunStatus.COMPLETED)
    answered = _credit_of(globex_api, second)
    assert answered["status"] == ToolCallStatus.SUCCEEDED and answered["error_code"] == ALREADY_DONE
    assert answered["idempotency_key"] is None and answered["business_key"] == original["business_key"]
    assert (answered["reused_from"], answered["reused_from_run"]) == (original["id"], first)
    assert answered["message"] == ALREADY_DONE_TEXT  # what the console shows the customer
    # The model was told it was already done, with the first booking's result.
    told = Message.objects.get(run_id=second, role=MessageRole.TOOL, tool_name="ledger_credit")
    assert '"already_done": true' in told.content and '"reference": "SET-2"' in told.content
    assert len(ledger_bookings()) == 1

    # The first run forked: a new session of globex's, from the message that started it, whose run
    # asks for SET-2 again — answered from the first run's booking, not booked.
    forked = globex_api.post(f"/runs/{first}/fork", {"reason": "replay the settlement"})
    assert forked.status_code == 201, forked.text
    fork, fork_session = forked.json()["id"], forked.json()["session_id"]
    assert fork_session != session
    assert [(m.role, m.content) for m in Message.objects.filter(session_id=fork_session).order_by("seq")][0] == (
        MessageRole.USER, "Settle SET-2 for globex: 8.00")
    wait_for_run(fork, RunStatus.COMPLETED)
    answered = _credit_of(globex_api, fork)
    assert (answered["error_code"], answered["reused_from"], answered["reused_from_run"]) == (
        ALREADY_DONE, original["id"], first)
    assert globex_api.get(f"/runs/{fork}").json()["forked_from"] == first
    assert globex_api.get(f"/runs/{first}").json()["forks"] == [fork]
    assert len(ledger_bookings()) == 1

    # Another customer's session asks for the same settlement: answered, not booked; that
    # customer is not shown the first customer's run.
    elsewhere = other_api.post("/sessions", {"title": "same payout", "agent": "payout-clerk-set-2"}).json()["id"]
    third = _post(other_api, elsewhere)
    wait_for_run(third, RunStatus.COMPLETED)
    answered = _credit_of(other_api, third)
    assert (answered["error_code"], answered["reused_from"], answered["reused_from_run"]) == (
        ALREADY_DONE, original["id"], None)
    assert len(ledger_bookings()) == 1

    # A run that booked SET-3 and then failed (its budget ended after one model call), retried:
    # the retry completes without booking again.
    third_session = globex_api.post("/sessions", {"title": "SET-3", "agent": "payout-clerk-set-3"}).json()["id"]
    failing = _post(globex_api, third_session, budgets={"max_model_calls": 1})
    wait_for_run(failing, RunStatus.FAILED)
    assert Run.objects.get(pk=failing).error_code == RunErrorCode.MODEL_CALL_BUDGET
    booked = _credit_of(globex_api, failing)
    assert booked["status"] == ToolCallStatus.SUCCEEDED and booked["business_key"] == "ledger_credit:credit:globex:SET-3"
    assert sorted(b["reference"] for b in ledger_bookings()) == ["SET-2", "SET-3"]
    retried = globex_api.post(f"/runs/{failing}/retry", {"reason": "budget", "budgets": {"max_model_calls": 4}})
    assert retried.status_code == 201, retried.text
    retry = retried.json()["id"]
    wait_for_run(retry, RunStatus.COMPLETED)
    answered = _credit_of(globex_api, retry)
    assert (answered["error_code"], answered["reused_from"], answered["reused_from_run"]) == (
        ALREADY_DONE, booked["id"], failing)
    assert sorted(b["reference"] for b in ledger_bookings()) == ["SET-2", "SET-3"]
