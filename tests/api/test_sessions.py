"""Sessions and messages: create, list, detail with history, and posting a message — which
starts a run (queued and enqueued for a worker) or, while a run is active, queues the input
for it (SPEC §8)."""

from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.models import OrmQ

from runs_app.models import Run, RunEvent, RunStatus
from sessions_app.models import Message, PendingInput, Session
from tests.support.api import grant
from tests.support.factories import MessageFactory, PendingInputFactory, RunFactory, SessionFactory

pytestmark = pytest.mark.django_db


def test_create_session_belongs_to_the_caller(alice, alice_api):
    response = alice_api.post("/sessions", {"title": "Refund for order 9527"})
    assert response.status_code == 201
    body = response.json()
    assert body["owner"] == "alice"
    assert body["active_run_id"] is None
    assert Session.objects.get(pk=body["id"]).owner == alice


def test_create_session_without_title(alice_api):
    assert alice_api.post("/sessions", {}).json()["title"] == ""


def test_an_intent_switch_while_nothing_runs_cancels_the_run_and_starts_the_next(alice, alice_api):
    session = SessionFactory(owner=alice)
    active = RunFactory(session=session, status=RunStatus.WAITING, phase="", wait_reason="approval")
    response = alice_api.post(f"/sessions/{session.pk}/messages", {"content": "forget it: the weather?", "mode": "new_intent"})
    assert response.status_code == 202
    body = response.json()
    active.refresh_from_db()
    assert active.status == RunStatus.CANCELLED
    next_run = Run.objects.get(session=session, status=RunStatus.QUEUED)
    assert body["pending_input"]["consumed_by_run_id"] == str(next_run.pk)
    assert body["pending_input"]["disposition"] == "new_run"


@pytest.mark.parametrize("payload,field", [
    ({"title": "x" * 201}, "body.title"),
    ({"title": "nul\x00byte"}, "body.title"),
    ({"title": 12}, "body.title"),
])
def test_create_session_rejects_bad_titles_and_writes_nothing(alice_api, payload, field):
    before = Session.objects.count()
    response = alice_api.post("/sessions", payload)
    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"
    assert field in [f["field"] for f in response.json()["fields"]]
    assert Session.objects.count() == before


def test_list_shows_own_sessions_newest_first_with_the_active_run(alice, bob, alice_api):
    old = SessionFactory(owner=alice)
    busy = SessionFactory(owner=alice)
    run = RunFactory(session=busy)
    SessionFactory(owner=bob)
    items = alice_api.get("/sessions").json()["items"]
    assert [item["id"] for item in items] == [str(busy.pk), str(old.pk)]
    assert items[0]["active_run_id"] == str(run.pk)
    assert items[1]["active_run_id"] is None


def test_list_pages_through_everything_exactly_once(alice, alice_api):
    created = {str(SessionFactory(owner=alice).pk) for _ in range(7)}
    # Equal timestamps must not lose or repeat rows: the id breaks ties.
    Session.objects.filter(owner=alice).update(created_at=timezone.now() - timedelta(days=1))
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        body = alice_api.get("/sessions", params).json()
        seen += [item["id"] for item in body["items"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert sorted(seen) == sorted(created) and len(seen) == len(set(seen))


def test_operators_with_view_session_see_other_peoples_sessions(alice, bob, bob_api):
    session = SessionFactory(owner=alice)
    assert bob_api.get(f"/sessions/{session.pk}").status_code == 404
    grant(bob, ("sessions_app", "view_session"))
    assert bob_api.get(f"/sessions/{session.pk}").status_code == 200
    assert str(session.pk) in {item["id"] for item in bob_api.get("/sessions").json()["items"]}


def test_detail_has_history_in_order_and_pending_input(alice, alice_api):
    session = SessionFactory(owner=alice)
    run = RunFactory(session=session)
    for text in ["one", "two", "three"]:
        MessageFactory(session=session, content=text, run=run)
    PendingInputFactory(session=session, content="also order 9528", mode="supplement")
    body = alice_api.get(f"/sessions/{session.pk}").json()
    assert [m["content"] for m in body["messages"]] == ["one", "two", "three"]
    assert [m["seq"] for m in body["messages"]] == [1, 2, 3]
    assert body["active_run_id"] == str(run.pk)
    assert [(p["content"], p["mode"], p["disposition"]) for p in body["pending_inputs"]] == [
        ("also order 9528", "supplement", None)
    ]


def test_messages_page_by_sequence_number(alice, alice_api):
    session = SessionFactory(owner=alice)
    for n in range(5):
        MessageFactory(session=session, content=f"m{n}")
    first = alice_api.get(f"/sessions/{session.pk}/messages", {"limit": 2}).json()
    assert [m["content"] for m in first["items"]] == ["m0", "m1"]
    rest = alice_api.get(f"/sessions/{session.pk}/messages", {"after": first["next_after"]}).json()
    assert [m["content"] for m in rest["items"]] == ["m2", "m3", "m4"]
    done = alice_api.get(f"/sessions/{session.pk}/messages", {"after": rest["next_after"]}).json()
    assert done == {"items": [], "next_after": 5}


def test_unknown_and_malformed_session_ids(alice_api):
    missing = alice_api.get("/sessions/6f1c2b8e-0000-4000-8000-000000000000")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    malformed = alice_api.get("/sessions/not-a-uuid")
    assert malformed.status_code == 422
    assert malformed.json()["fields"][0]["field"] == "path.session_id"


# --- posting messages ---------------------------------------------------------------------

def test_a_message_in_an_idle_session_starts_a_queued_run_enqueued_after_commit(
    alice, alice_api, django_capture_on_commit_callbacks
):
    session = SessionFactory(owner=alice)
    queued_before = OrmQ.objects.count()
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_api.post(f"/sessions/{session.pk}/messages", {"content": "Refund order 9527", "mode": "auto"})
    assert response.status_code == 201
    body = response.json()
    assert body["disposition"] == "started_run"
    assert body["pending_input"] is None
    assert body["message"]["content"] == "Refund order 9527" and body["message"]["role"] == "user"
    run = Run.objects.get(pk=body["run"]["id"])
    assert (run.status, run.phase, run.created_by) == (RunStatus.QUEUED, "waiting_worker", alice)
    assert body["message"]["run_id"] == str(run.pk)
    assert OrmQ.objects.count() == queued_before + 1  # handed to django-q2's ORM broker


def test_budgets_of_the_started_run_can_be_set(alice, alice_api):
    session = SessionFactory(owner=alice)
    response = alice_api.post(f"/sessions/{session.pk}/messages", {
        "content": "go", "budgets": {"max_model_calls": 3, "max_tokens": 5000, "deadline_seconds": 60},
    })
    run = Run.objects.get(pk=response.json()["run"]["id"])
    assert (run.max_model_calls, run.max_tokens) == (3, 5000)
    assert timedelta(seconds=50) < run.deadline - timezone.now() <= timedelta(seconds=60)


@pytest.mark.parametrize("mode", ["auto", "supplement", "queue"])
def test_a_message_while_a_run_is_active_is_stored_for_it_never_a_second_run(alice, alice_api, mode):
    session = SessionFactory(owner=alice)
    active = RunFactory(session=session, status=RunStatus.WAITING, phase="", wait_reason="approval")
    response = alice_api.post(f"/sessions/{session.pk}/messages", {"content": "the order number is 9527", "mode": mode})
    assert response.status_code == 202
    body = response.json()
    assert body["disposition"] == "pending"
    assert body["run"]["id"] == str(active.pk)
    assert body["message"] is None
    pending = PendingInput.objects.get(pk=body["pending_input"]["id"])
    assert (pending.mode, pending.content, pending.submitted_by) == (mode, "the order number is 9527", alice)
    assert Run.objects.filter(session=session).count() == 1
    assert RunEvent.objects.filter(run=active, type="input_queued").exists()


@pytest.mark.parametrize("payload,field", [
    ({}, "body.content"),
    ({"content": ""}, "body.content"),
    ({"content": "x" * 20_001}, "body.content"),
    ({"content": "hi", "mode": "shout"}, "body.mode"),
    ({"content": "hi", "budgets": {"max_model_calls": 0}}, "body.budgets.max_model_calls"),
    ({"content": "hi", "budgets": {"deadline_seconds": 10**12}}, "body.budgets.deadline_seconds"),
    ({"content": "a\x00b"}, "body.content"),
])
def test_invalid_messages_are_422_listing_the_field_and_write_nothing(alice, alice_api, payload, field):
    session = SessionFactory(owner=alice)
    response = alice_api.post(f"/sessions/{session.pk}/messages", payload)
    assert response.status_code == 422
    assert field in [f["field"] for f in response.json()["fields"]]
    assert not Run.objects.filter(session=session).exists()
    assert not Message.objects.filter(session=session).exists()


def test_whitespace_only_message_is_refused_by_the_service(alice, alice_api):
    session = SessionFactory(owner=alice)
    response = alice_api.post(f"/sessions/{session.pk}/messages", {"content": "   "})
    assert response.status_code == 422
    assert response.json()["code"] == "empty_message"
    assert not Run.objects.filter(session=session).exists()


def test_only_the_owner_may_post_even_an_operator_who_can_read_it(alice, api_operator, operator_api):
    session = SessionFactory(owner=alice)
    assert operator_api.get(f"/sessions/{session.pk}").status_code == 200
    response = operator_api.post(f"/sessions/{session.pk}/messages", {"content": "hello from the desk"})
    assert response.status_code == 403
    assert response.json()["code"] == "not_permitted"
    assert not Message.objects.filter(session=session).exists()
