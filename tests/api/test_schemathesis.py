"""Property-based testing against the live OpenAPI schema: schemathesis generates requests for
every operation (valid and invalid), authenticated with a real API key — of a customer who owns
data, and of an operator who may decide, cancel, retry and reconcile it — and checks that no
response is a 5xx, every response matches the schema, a request the schema does not allow (a body
that is not an object, a field of the wrong type) is refused, and a request the schema allows is
not refused as malformed (issue 27, finding 11: the schema promises only what the server accepts;
a 404, 409 or 403 about the objects named is an answer, not a rejection).

Bounded: a dozen or two examples per operation and caller, so it is part of the normal suite;
`WARDEN_FUZZ_EXAMPLES=200 WARDEN_FUZZ_REPORT=file` runs the longer campaign docs/SECURITY.md
records, and writes what it sent and how it was answered to `file`."""

import collections
import itertools
import json
import os
import time
from types import SimpleNamespace

import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance, negative_data_rejection, positive_data_acceptance, response_schema_conformance,
    status_code_conformance,
)

from api import streams
from tests.support.api import build_world, grant
from tests.support.factories import ApiKeyFactory, UserFactory

MAX_EXAMPLES = int(os.environ.get("WARDEN_FUZZ_EXAMPLES", "15"))
# (caller, status class) -> requests sent, for the campaign's report.
SENT: collections.Counter = collections.Counter()


@pytest.fixture(scope="module", autouse=True)
def campaign_report():
    yield
    if path := os.environ.get("WARDEN_FUZZ_REPORT"):
        with open(path, "w") as report:
            json.dump({"examples_per_operation": MAX_EXAMPLES,
                       "sent": {f"{caller} {status}": count for (caller, status), count in sorted(SENT.items())}},
                      report, indent=1)


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


# What an operator of the desk holds: deciding, cancelling and retrying, reconciling, seeing all.
OPERATOR_PERMISSIONS = [
    ("approvals_app", "decide_approval"), ("runs_app", "view_run"), ("runs_app", "change_run"),
    ("tools_app", "view_toolcall"), ("tools_app", "reconcile_toolcall"), ("approvals_app", "view_approval"),
    ("sessions_app", "view_session"),
]


# A session's stream (and the account's) does not end with a run: each example holds for its whole
# max_seconds (1, the least the schema allows) — half a minute per operation and caller. Here the
# streams' clock runs STREAM_CLOCK_SPEED times faster, so a stream's second is a few polls long;
# what a stream sends and when it ends is tested on the real clock (test_many_runs_events.py,
# test_event_stream.py).
STREAM_CLOCK_SPEED = 20


@pytest.fixture(autouse=True)
def fast_stream_clock(monkeypatch):
    start = time.monotonic()
    monkeypatch.setattr(streams, "time", SimpleNamespace(
        monotonic=lambda: start + (time.monotonic() - start) * STREAM_CLOCK_SPEED,
        sleep=lambda seconds: time.sleep(seconds / STREAM_CLOCK_SPEED)))


@pytest.fixture(params=["customer", "operator"])
def owner_data(request, db):
    """A customer with sessions, runs, tool calls and approvals of their own; the key is theirs,
    or an operator's who acts on them."""
    owner = UserFactory(username="fuzz-owner")
    world = build_world(owner)
    build_world(UserFactory(username="fuzz-other"))  # data the customer must never see
    caller = owner
    if request.param == "operator":
        caller = grant(UserFactory(username="fuzz-operator", is_staff=True), *OPERATOR_PERMISSIONS)
    return {"secret": ApiKeyFactory(owner=caller).secret, "world": world, "caller": request.param}


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
    checks = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance,
              positive_data_acceptance]
    # A request the schema does not allow must be refused — unless this test replaced the part
    # that made it invalid (then it is no longer what the generator meant to send).
    if not negated_parts(case) & altered:
        checks.append(negative_data_rejection)
    headers = {"Authorization": f"Bearer {owner_data['secret']}"}
    response = case.call(headers=headers)
    SENT[(owner_data["caller"], f"{response.status_code // 100}xx")] += 1
    case.validate_response(response, checks, headers=headers, transport_kwargs={"headers": dict(headers)})


def negated_parts(case) -> set[str]:
    """Where the generator made the case invalid: path, query, header, cookie, body."""
    if case.meta is None:
        return set()
    return {location.name.lower() for location, info in case.meta.components.items() if info.mode.is_negative}
