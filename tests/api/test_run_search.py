"""The API finds what the desk finds (issue 28): `GET /runs?q=` searches as the desk's search box
does — by business reference (a tool argument or the business key), order number and idempotency
key — `?agent=` and `?tool=` narrow to one agent's runs and to the runs that called a tool; a customer's search never reaches another's runs;
list items carry the session's title and the agent."""

from tests.support.factories import AgentFactory, RunFactory, SessionFactory, ToolCallFactory
from tools_app.models import ToolEffect


def _ids(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [item["id"] for item in response.json()["items"]]


def _credit(run, *, reference: str, order: str, key: str | None = None):
    return ToolCallFactory(step__run=run, tool_name="ledger_credit", effect=ToolEffect.WRITE,
                           arguments={"account": "acme", "amount": "12.00", "reference": reference, "order_id": order},
                           business_key=f"credit:acme:{reference}", idempotency_key=key or f"idem-{reference}")


def test_q_finds_a_run_by_business_reference_order_number_and_idempotency_key(alice, alice_api, bob):
    mine = RunFactory(session=SessionFactory(owner=alice, title="payouts"))
    other = RunFactory(session=SessionFactory(owner=alice, title="refunds"))
    _credit(mine, reference="INV-2041", order="9540")
    _credit(other, reference="INV-7", order="1234")
    strangers = RunFactory(session=SessionFactory(owner=bob))
    _credit(strangers, reference="INV-2041", order="9540", key="idem-bob")  # the same reference elsewhere

    for term in ("INV-2041", "credit:acme:INV-2041", "9540", "idem-INV-2041", str(mine.pk), str(mine.session_id)):
        assert _ids(alice_api.get("/runs", {"q": term})) == [str(mine.pk)], term
    assert _ids(alice_api.get("/runs", {"q": "no-such-reference"})) == []
    # Combined with the other filters, and paged like any list.
    assert _ids(alice_api.get("/runs", {"q": "9540", "status": "completed"})) == []
    assert _ids(alice_api.get("/runs", {"q": "payouts", "limit": 1})) == [str(mine.pk)]


def test_agent_narrows_to_one_agents_runs(alice, alice_api):
    clerk, helper = AgentFactory(slug="payout-clerk"), AgentFactory(slug="helper")
    by_clerk = RunFactory(session=SessionFactory(owner=alice), agent_version=clerk.current_version)
    RunFactory(session=SessionFactory(owner=alice), agent_version=helper.current_version)
    assert _ids(alice_api.get("/runs", {"agent": "payout-clerk"})) == [str(by_clerk.pk)]
    assert _ids(alice_api.get("/runs", {"agent": "nobody"})) == []


def test_tool_narrows_to_the_runs_that_called_it(alice, alice_api, bob):
    credited = RunFactory(session=SessionFactory(owner=alice))
    _credit(credited, reference="INV-9", order="77")
    ToolCallFactory(step__run=RunFactory(session=SessionFactory(owner=alice)))  # a query_order only
    _credit(RunFactory(session=SessionFactory(owner=bob)), reference="INV-10", order="78")  # not alice's
    assert _ids(alice_api.get("/runs", {"tool": "ledger_credit"})) == [str(credited.pk)]
    assert _ids(alice_api.get("/runs", {"tool": "ledger_credit", "agent": "payout-clerk"})) == []
    assert _ids(alice_api.get("/runs", {"tool": "no_such_tool"})) == []


def test_list_items_say_which_agent_and_about_what(alice, alice_api):
    clerk = AgentFactory(slug="payout-clerk")
    RunFactory(session=SessionFactory(owner=alice, title="Payout to ACME"), agent_version=clerk.current_version)
    RunFactory(session=SessionFactory(owner=alice, title="old"))  # from before agents
    items = alice_api.get("/runs").json()["items"]
    assert [(item["title"], item["agent"]) for item in items] == [("old", None), ("Payout to ACME", "payout-clerk")]


def test_an_empty_or_unstorable_search_is_refused_by_name(alice_api):
    for bad in ("", "\x00"):
        response = alice_api.get("/runs", {"q": bad})
        assert response.status_code == 422, response.content
        assert [f["field"] for f in response.json()["fields"]] == ["query.q"]
