"""Search on the desk by what an operator has in hand: an order number (any tool argument), the
customer, a session title, an idempotency key — not only an exact UUID (SPEC §13)."""

import pytest
from django.urls import reverse

from tests.support.desk import csrf_client
from tests.support.factories import RunFactory, SessionFactory, StepFactory, ToolCallFactory, UserFactory

pytestmark = pytest.mark.django_db

RUNS = reverse("admin:runs_app_run_changelist")


def found(client, url, term) -> set:
    response = client.get(url, {"q": term})
    assert response.status_code == 200
    return {row.pk for row in response.context["cl"].result_list}


@pytest.fixture
def runs():
    bob = UserFactory(username="bob")
    weather = RunFactory(session=SessionFactory(owner=bob, title="Weather in Lisbon"))
    ToolCallFactory(run=weather, step=StepFactory(run=weather, kind="tools"), tool_name="get_weather", arguments={"city": "Lisbon"})
    refund = RunFactory(session=SessionFactory(owner=UserFactory(username="carol"), title="my money back"))
    ToolCallFactory(run=refund, step=StepFactory(run=refund, kind="tools"), tool_name="execute_refund", effect="write",
                    arguments={"order_id": "9527", "amount": "25.00"}, idempotency_key="execute_refund:abc:refund:9527:25.00")
    numeric = RunFactory(session=SessionFactory(owner=bob, title="other"))
    ToolCallFactory(run=numeric, step=StepFactory(run=numeric, kind="tools"), tool_name="query_order", arguments={"order_id": 4242})
    return {"weather": weather, "refund": refund, "numeric": numeric}


@pytest.mark.parametrize("term,expected", [
    ("9527", {"refund"}),  # an order number, in a tool call's arguments
    ("25.00", {"refund"}),  # any argument
    ("4242", {"numeric"}),  # a number stored as a number
    ("Lisbon", {"weather"}),  # the session title and the city argument
    ("money back", {"refund"}),  # words of the session title
    ("carol", {"refund"}),  # the customer
    ("bob", {"weather", "numeric"}),
    ("execute_refund:abc:refund:9527:25.00", {"refund"}),  # the idempotency key
    ("9999", set()),
    ('"; DROP TABLE x; --', set()),  # text, never SQL
])
def test_runs_are_found_by_business_keys(viewer, runs, term, expected):
    assert found(csrf_client(viewer), RUNS, term) == {runs[name].pk for name in expected}


def test_a_run_is_found_by_its_id_and_its_sessions_id(viewer, runs):
    client = csrf_client(viewer)
    assert found(client, RUNS, str(runs["refund"].pk)) == {runs["refund"].pk}
    assert found(client, RUNS, str(runs["refund"].session_id)) == {runs["refund"].pk}


def test_approvals_unknown_calls_and_sessions_search_the_same_way(viewer, pending_refund, unknown_refund):
    client = csrf_client(viewer)
    assert found(client, reverse("admin:approvals_app_approval_changelist"), "9527") == {pending_refund.approval.pk}
    assert found(client, reverse("admin:approvals_app_approval_changelist"), "alice") == {pending_refund.approval.pk}
    assert found(client, reverse("admin:tools_app_unknowntoolcall_changelist"), "9527") == {unknown_refund.refund.pk}
    sessions = found(client, reverse("admin:sessions_app_session_changelist"), "9527")
    assert {pending_refund.run.session_id, unknown_refund.run.session_id} <= sessions
