"""Property-based testing against the live OpenAPI schema: schemathesis generates requests for
every operation (valid and invalid), authenticated with a real API key of a user who owns
data, and checks that no response is a 5xx, every response matches the schema, and a request
the schema does not allow (a body that is not an object, a field of the wrong type) is refused.

Bounded: a couple of dozen examples per operation, so it is part of the normal suite."""

import itertools

import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance, negative_data_rejection, response_schema_conformance, status_code_conformance,
)

from tests.support.api import build_world
from tests.support.factories import ApiKeyFactory, UserFactory

MAX_EXAMPLES = 25


# The live schema, served by the app itself through Django's WSGI handler (same thread, same
# connection as the test, so the data each test creates is visible to the requests).
schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", WSGIHandler())


@pytest.fixture(autouse=True)
def keep_the_test_connection(db):
    # The per-request connection cleanup would close the test's connection (and the
    # transaction holding its data); Django's test client turns it off the same way.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def owner_data(db):
    """A user with sessions, runs, tool calls and approvals of their own, and their key."""
    owner = UserFactory(username="fuzz-owner")
    world = build_world(owner)
    build_world(UserFactory(username="fuzz-other"))  # data that must never show up
    return {"secret": ApiKeyFactory(owner=owner).secret, "world": world}


def real_ids(world) -> dict[str, list[str]]:
    """Ids the owner may address, substituted for half of the generated ones so operations
    reach real objects and not only 404s."""
    return {
        "session_id": [str(world.session.pk), str(world.approval_run.session_id)],
        "run_id": [str(world.run.pk), str(world.approval_run.pk), str(world.unknown_run.pk)],
        "tool_call_id": [str(world.unknown_call.pk), str(world.user_approval.tool_call_id)],
        "approval_id": [str(world.user_approval.pk), str(world.operator_approval.pk)],
    }


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])
def test_api_never_fails_and_always_matches_its_schema(case, owner_data):
    ids = real_ids(owner_data["world"])
    counter = owner_data.setdefault("counter", itertools.count())
    altered = {"header"}  # the Authorization header is always replaced by the owner's key
    for name, value in list((case.path_parameters or {}).items()):
        if name in ids and next(counter) % 2 == 0:
            choices = ids[name][:1] if case.path.endswith("/stream") else ids[name]
            case.path_parameters[name] = choices[hash(str(value)) % len(choices)]
            altered.add("path")
    if case.path.endswith("/stream"):
        # A live run's stream waits for events; keep every stream short.
        case.query = {**(case.query or {}), "max_seconds": 1}
        altered.add("query")
    checks = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance]
    # A request the schema does not allow must be refused — unless this test replaced the part
    # that made it invalid (then it is no longer what the generator meant to send).
    if not negated_parts(case) & altered:
        checks.append(negative_data_rejection)
    case.call_and_validate(headers={"Authorization": f"Bearer {owner_data['secret']}"}, checks=checks)


def negated_parts(case) -> set[str]:
    """Where the generator made the case invalid: path, query, header, cookie, body."""
    if case.meta is None:
        return set()
    return {location.name.lower() for location, info in case.meta.components.items() if info.mode.is_negative}
