"""The events of many runs (issue 28): a session's — every run of it, one after the other — and
every run the caller may see (runs_app.follow_all_events), as pages and as streams, in commit order
with one cursor. Who may read them is the access policy's answer; a cursor the server did not hand
out is a 422. The last test holds transactions open to show the order is the commits' order, not
the ids': an event that took a lower id but committed later is delivered, not skipped.

Another writing transaction in the test database can hold events back for a moment — that is the
rule that makes the cursor safe — so reads that expect events wait for them (`read_all`) rather than
expect them at once. One in another database on the same server (another test database's) does not."""

import json
import uuid

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from api import streams
from runs_app.models import Run, RunEvent, RunStatus, WaitReason
from tests.support.api import Api, grant
from tests.support.factories import ApiKeyFactory, RunEventFactory, RunFactory, SessionFactory, UserFactory
from tests.support.processes import wait_for

pytestmark = pytest.mark.django_db

FOLLOW_ALL = ("runs_app", "follow_all_events")


@pytest.fixture
def fast_stream(monkeypatch):
    monkeypatch.setattr(streams, "SSE_POLL_SECONDS", 0.01)
    monkeypatch.setattr(streams, "SSE_KEEPALIVE_SECONDS", 0.05)


def with_events(run: Run, count: int) -> Run:
    for seq in range(1, count + 1):
        RunEventFactory(run=run, seq=seq, type="run_status", payload={"status": f"s{seq}"})
    Run.objects.filter(pk=run.pk).update(event_seq=count)
    return run


@pytest.fixture
def two_runs(alice):
    """Alice's session: a completed run (3 events), then the next one, waiting (2 events)."""
    session = SessionFactory(owner=alice)
    first = with_events(RunFactory(session=session, status=RunStatus.COMPLETED, phase="", finished_at=timezone.now()), 3)
    second = with_events(RunFactory(session=session, status=RunStatus.WAITING, phase="", wait_reason=WaitReason.APPROVAL), 2)
    return session, [(first.pk, seq) for seq in (1, 2, 3)] + [(second.pk, seq) for seq in (1, 2)]


def as_pairs(items) -> list[tuple]:
    return [(uuid.UUID(item["run_id"]), item["seq"]) for item in items]


def sse_pairs(events) -> list[tuple]:
    return [(uuid.UUID(event["data"]["run_id"]), event["data"]["seq"]) for event in events]


def read_all(api, path: str, count: int, *, after: str | None = None, limit: int = 2) -> list[dict]:
    """Pages from `after` until `count` events came, each page from the last one's next_after."""
    items: list[dict] = []

    def more() -> bool:
        nonlocal after
        page = api.get(path, {"limit": limit, **({"after": after} if after else {})})
        assert page.status_code == 200, page.content
        items.extend(page.json()["items"])
        after = page.json()["next_after"]
        return len(items) >= count

    wait_for(more, message=f"{count} events from {path}")
    return items


def sse_events(stream, count: int) -> list[dict]:
    """The next `count` event frames of a test-client stream, as {id, event, data}."""
    events = []
    while len(events) < count:
        chunk = next(stream).decode()
        if chunk.startswith("id: "):
            id_line, event_line, data_line = chunk.strip().split("\n")
            events.append({"id": id_line.removeprefix("id: "), "event": event_line.removeprefix("event: "),
                           "data": json.loads(data_line.removeprefix("data: "))})
    return events


def test_a_sessions_events_page_through_every_run_in_order(alice_api, two_runs):
    session, expected = two_runs
    items = read_all(alice_api, f"/sessions/{session.pk}/events", len(expected))
    assert as_pairs(items) == expected
    assert len({item["cursor"] for item in items}) == len(items)
    assert {item["type"] for item in items} == {"run_status"} and items[0]["payload"] == {"status": "s1"}
    # From the last cursor: nothing more, and the cursor stays where it was.
    last = alice_api.get(f"/sessions/{session.pk}/events", {"after": items[-1]["cursor"]}).json()
    assert last == {"items": [], "next_after": items[-1]["cursor"]}


def test_the_session_stream_goes_on_across_runs_and_resumes_from_last_event_id(alice_api, two_runs, fast_stream):
    session, expected = two_runs
    path = f"/sessions/{session.pk}/events/stream"
    with alice_api.stream(path, {"max_seconds": 1}) as stream:
        assert next(stream).decode() == "retry: 2000\n\n"
        first = sse_events(stream, 3)
        assert sse_pairs(first) == expected[:3]
        assert set(first[0]["data"]) >= {"run_id", "seq", "type", "payload", "created_at"}
        # The first run is over; the stream is not: it sends the next run's events.
        rest = sse_events(stream, 2)
        assert sse_pairs(rest) == expected[3:]

    # Reconnecting with the third event's id: the fourth and fifth, nothing before (the header wins over ?after=).
    with alice_api.stream(path, {"max_seconds": 1, "after": first[0]["id"]}, HTTP_LAST_EVENT_ID=first[2]["id"]) as again:
        assert [e["id"] for e in sse_events(again, 2)] == [e["id"] for e in rest]
        assert next(again).decode() == ": keepalive\n\n"  # and then nothing: no duplicate, no end


def test_an_open_session_stream_ends_when_its_key_is_revoked(alice, two_runs, fast_stream, monkeypatch):
    """The same re-check and the same `error` frame as a run's stream, about the session."""
    from sessions_app.api_keys import api_key_revoke

    monkeypatch.setattr(streams, "SSE_RECHECK_SECONDS", 0.02)
    session, expected = two_runs
    key = ApiKeyFactory(owner=alice)
    stream = iter(Api(key.secret).get(f"/sessions/{session.pk}/events/stream", {"max_seconds": 60}).streaming_content)
    assert len(sse_events(stream, len(expected))) == len(expected)
    api_key_revoke(api_key=key)
    rest = [chunk.decode() for chunk in stream if not chunk.startswith(b":")]
    assert rest == ['event: error\ndata: {"code": "access_revoked", "message": "You may no longer see this session."}\n\n']


@pytest.mark.parametrize("path,params,headers", [
    ("/sessions/{session}/events", {"after": "12"}, {}),
    ("/sessions/{session}/events", {"after": "1_2_3"}, {}),
    ("/sessions/{session}/events/stream", {}, {"HTTP_LAST_EVENT_ID": "5"}),
    ("/sessions/{session}/events/stream", {"after": "x_1"}, {}),
    ("/events", {"after": "1 2"}, {}),
    ("/events/stream", {}, {"HTTP_LAST_EVENT_ID": "1_"}),
])
def test_a_malformed_cursor_is_a_422(alice, alice_api, two_runs, path, params, headers):
    grant(alice, FOLLOW_ALL)
    session, _ = two_runs
    response = alice_api.get(path.format(session=session.pk), params, **headers)
    assert response.status_code == 422, response.content
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["code"] == "validation_error" and response.json()["message"]


def test_another_users_session_is_404_like_its_detail(bob_api, two_runs):
    session, _ = two_runs
    for path in ("", "/events", "/events/stream"):
        response = bob_api.get(f"/sessions/{session.pk}{path}")
        assert response.status_code == 404 and response.json()["code"] == "not_found", path


def test_a_reader_of_sessions_who_may_not_read_runs_is_refused_their_events(bob, bob_api, two_runs):
    """sessions_app.view_session reads any session's history, not its runs (access/policy.py)."""
    grant(bob, ("sessions_app", "view_session"))
    session, _ = two_runs
    assert bob_api.get(f"/sessions/{session.pk}").status_code == 200
    for path in ("/events", "/events/stream"):
        response = bob_api.get(f"/sessions/{session.pk}{path}")
        assert response.status_code == 403 and response.json()["code"] == "not_permitted", path


def test_the_account_feed_needs_its_permission(alice, alice_api, two_runs):
    for path in ("/events", "/events/stream"):
        response = alice_api.get(path)
        assert response.status_code == 403 and response.json()["code"] == "not_permitted"
        assert "runs_app.follow_all_events" in response.json()["message"]
    grant(alice, FOLLOW_ALL)
    assert alice_api.get("/events").status_code == 200


def test_the_account_feed_holds_every_run_the_caller_may_see_and_no_other(alice, bob, two_runs, fast_stream):
    _, alices = two_runs
    bobs_run = with_events(RunFactory(session=SessionFactory(owner=bob), status=RunStatus.WAITING, phase="",
                                      wait_reason=WaitReason.APPROVAL), 2)
    everyone = {*alices, (bobs_run.pk, 1), (bobs_run.pk, 2)}
    alice_api = Api(ApiKeyFactory(owner=grant(alice, FOLLOW_ALL)).secret)
    operator_api = Api(ApiKeyFactory(owner=grant(UserFactory(), FOLLOW_ALL, ("runs_app", "view_run"))).secret)

    own = read_all(alice_api, "/events", len(alices))
    assert as_pairs(own) == alices
    assert alice_api.get("/events", {"after": own[-1]["cursor"]}).json()["items"] == []  # not Bob's

    # The operator's stream: three events, a dropped connection, the rest from Last-Event-ID.
    with operator_api.stream("/events/stream", {"max_seconds": 1}) as stream:
        first = sse_events(stream, 3)
    with operator_api.stream("/events/stream", {"max_seconds": 1}, HTTP_LAST_EVENT_ID=first[-1]["id"]) as resumed:
        rest = sse_events(resumed, len(everyone) - 3)
    seen = sse_pairs(first + rest)
    assert sorted(seen) == sorted(everyone) and len(seen) == len(everyone)
    assert seen == as_pairs(read_all(operator_api, "/events", len(everyone)))


# --- commit order ---------------------------------------------------------------------------------

SLOW, FAST = "step_started", "input_queued"

def open_writer(dbname: str | None = None) -> psycopg.Connection:
    """A connection of its own to the test database (or `dbname`), whose transactions the test opens and commits."""
    settings = connection.settings_dict
    return psycopg.connect(dbname=dbname or settings["NAME"], host=settings["HOST"], port=settings["PORT"] or 5432,
                           user=settings["USER"], password=settings["PASSWORD"] or None)


def insert_event(writer: psycopg.Connection, run: Run, seq: int, kind: str) -> int:
    """An event as the engine writes it (a raw INSERT; the database stamps its transaction). The two
    writers write different types: the suite's event-contract trigger notes each new type in a table
    of its own, and a second writer of the same new type would wait for the first."""
    row = writer.execute(
        "INSERT INTO runs_app_runevent (run_id, seq, type, payload, created_at) VALUES (%s, %s, %s, '{}', now()) "
        "RETURNING id", [run.pk, seq, kind]).fetchone()
    return row[0]


@pytest.mark.django_db(transaction=True)
def test_an_event_committed_after_a_later_one_is_delivered_not_skipped(alice):
    """Two runs of the account write at once. The transaction that took the lower id commits last:
    a cursor by id would hand out the higher one, move past the lower, and never send it. Here the
    committed event waits until the older transaction ends, and then both come, once each. Then the
    other way round: a transaction that began first (the lower transaction id) but wrote its event
    last still comes first, and nothing is sent twice."""
    api = Api(ApiKeyFactory(owner=grant(alice, FOLLOW_ALL)).secret)
    session = SessionFactory(owner=alice)
    run_a = RunFactory(session=session, status=RunStatus.COMPLETED, phase="", finished_at=timezone.now())
    run_b = RunFactory(session=SessionFactory(owner=alice))
    slow, fast = open_writer(), open_writer()
    try:
        lower_id = insert_event(slow, run_a, 1, SLOW)  # open: not committed
        with fast.transaction():
            higher_id = insert_event(fast, run_b, 1, FAST)
        assert higher_id > lower_id
        assert RunEvent.objects.filter(pk=higher_id).exists()  # committed and visible…
        held = api.get("/events").json()
        assert held == {"items": [], "next_after": None}  # …but not handed out while the lower one may still come
        slow.commit()
        first = read_all(api, "/events", 2)
        assert [item["cursor"].split("_")[1] for item in first] == [str(lower_id), str(higher_id)]

        # The other way round: `slow` takes its transaction id first, writes after `fast` committed.
        slow.execute("SELECT pg_current_xact_id()")
        with fast.transaction():
            fast_id = insert_event(fast, run_b, 2, FAST)
        assert api.get("/events", {"after": first[-1]["cursor"]}).json()["items"] == []
        slow_id = insert_event(slow, run_a, 2, SLOW)
        slow.commit()
        rest = read_all(api, "/events", 2, after=first[-1]["cursor"])
        assert [item["cursor"].split("_")[1] for item in rest] == [str(slow_id), str(fast_id)]
        assert api.get("/events", {"after": rest[-1]["cursor"]}).json()["items"] == []
        # The session's feed is the same order, restricted to the session's runs.
        assert [item["seq"] for item in read_all(api, f"/sessions/{session.pk}/events", 2)] == [1, 2]
    finally:
        slow.close()
        fast.close()


@pytest.mark.django_db(transaction=True)
def test_a_writing_transaction_in_another_database_does_not_hold_the_feed_back(alice):
    """Transaction ids are the whole server's: a long writing transaction in another database (a
    neighbour's application on a shared server) has an id below the events' own. It cannot write
    here, so the barrier leaves it out and the events come while it stays open; one in this
    database (the test above) holds them."""
    api = Api(ApiKeyFactory(owner=grant(alice, FOLLOW_ALL)).secret)
    run = RunFactory(session=SessionFactory(owner=alice))
    neighbour, writer = open_writer("postgres"), open_writer()
    try:
        neighbour.execute("SELECT pg_current_xact_id()")  # an id taken, the transaction left open
        with writer.transaction():
            event_id = insert_event(writer, run, 1, FAST)
        assert [item["cursor"].split("_")[1] for item in read_all(api, "/events", 1)] == [str(event_id)]
    finally:
        neighbour.close()
        writer.close()
