"""Efficiency: every list (and the run detail) costs a fixed number of queries, however many
rows it returns — no query per row."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents.selectors import mcp_tool_latest
from tests.support.api import build_world
from tests.support.factories import StepFactory, ToolCallFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def cache_outside_the_database(settings):
    """The rate limits' counters live in the shared cache: Redis in production, a database table
    only where there is no Redis (a laptop). What is counted here is the list's own database work,
    so the cache is kept out of the count."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Key lookup (with the caller's permissions) + the page.
LIST_QUERIES = 2


def queries(api, path, params=None) -> int:
    api.get("/me")  # the key's first use records last_used_at (at most once a minute): not counted
    with CaptureQueriesContext(connection) as captured:
        response = api.get(path, params)
    assert response.status_code == 200, response.content
    return len(captured.captured_queries)


@pytest.fixture
def many(alice):
    """Alice's objects several times over, so pages can hold 1 or many rows."""
    for _ in range(4):
        build_world(alice)


@pytest.mark.parametrize("path,params", [
    ("/sessions", {}),
    ("/runs", {}),
    ("/runs", {"status": "waiting", "wait_reason": "approval"}),
    ("/tool-calls", {}),
    ("/tool-calls", {"status": "unknown"}),
    ("/approvals", {"decidable": "false"}),
])
def test_lists_cost_the_same_number_of_queries_for_one_row_or_many(many, alice_api, operator_api, path, params):
    # A tool this deployment does not register may be an agent's MCP tool: which versions chose which,
    # the process reads in one query at most every 30 s (agents.selectors.mcp_tool_latest) — read now,
    # so that it is not counted against one request or the other.
    mcp_tool_latest("not-a-registered-tool")
    for api in (alice_api, operator_api):
        one = queries(api, path, {**params, "limit": 1})
        full = queries(api, path, {**params, "limit": 200})
        assert one == full == LIST_QUERIES


def test_the_second_page_costs_the_same_as_the_first(many, alice_api):
    first = alice_api.get("/runs", {"limit": 3}).json()
    assert queries(alice_api, "/runs", {"limit": 3, "cursor": first["next_cursor"]}) == LIST_QUERIES


def test_run_detail_cost_does_not_grow_with_steps_tool_calls_and_events(world, alice_api):
    small = queries(alice_api, f"/runs/{world.run.pk}")
    for index in range(1, 6):
        step = StepFactory(run=world.run, index=index)
        ToolCallFactory(step=step, run=world.run)
    assert queries(alice_api, f"/runs/{world.run.pk}") == small


def test_session_detail_and_message_pages_are_constant(world, alice_api):
    from tests.support.factories import MessageFactory

    detail = queries(alice_api, f"/sessions/{world.session.pk}")
    page = queries(alice_api, f"/sessions/{world.session.pk}/messages")
    for _ in range(5):
        MessageFactory(session=world.session)
    assert queries(alice_api, f"/sessions/{world.session.pk}") == detail
    assert queries(alice_api, f"/sessions/{world.session.pk}/messages") == page
