"""The console's changes are rate-limited like the API's (issue 12, finding 4: 100 sessions in
20 s were accepted): new sessions from its page and messages, cancels and decisions over its
socket count against the same per-user write limit (WARDEN_API_WRITE_RATE_PER_USER), shared with
the API; over it the change is refused with a message and nothing is written."""

import pytest
from django.test import Client, override_settings

from sessions_app.models import Message, PendingInput, Session
from engine.actions.sessions import session_open
from tests.support.console import ConsoleSocket, open_socket
from tests.support.factories import ApiKeyFactory, UserFactory


@pytest.mark.django_db
@override_settings(WARDEN_API_WRITE_RATE_PER_USER="3/hour")
def test_new_sessions_from_the_console_page_stop_at_the_write_limit():
    user = UserFactory(username="hasty")
    browser = Client()
    browser.force_login(user)
    answers = [browser.post("/console/sessions/new/", {"title": f"session {n}"}, follow=True) for n in range(5)]
    assert Session.objects.filter(owner=user).count() == 3
    refused = answers[3].content.decode()
    assert "Too many changes in a short time" in refused and "(throttled)" in refused
    # The API's writes count against the same limit: it is used up there too.
    api = Client(headers={"Authorization": f"Bearer {ApiKeyFactory(owner=user).secret}"})
    response = api.post("/api/v1/sessions", {"title": "by key"}, content_type="application/json")
    assert response.status_code == 429 and response.json()["code"] == "throttled"


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_messages_over_the_socket_stop_at_the_write_limit(procs):
    procs.base_env["WARDEN_API_WRITE_RATE_PER_USER"] = "3/hour"
    procs.start_web()
    user = UserFactory()
    session = session_open(owner=user, title="chatty")
    with ConsoleSocket(open_socket(procs, user=user)) as console:
        console.subscribe(session.pk)
        replies = []
        for n in range(4):
            console.send(action="post", session=str(session.pk), content=f"message {n}", mode="queue", ref=str(n))
            replies.append(console.until(lambda m, ref=str(n): m.get("ref") == ref))
    assert [r.get("disposition") for r in replies[:3]] == ["started_run", "pending", "pending"]
    assert replies[3]["type"] == "error" and replies[3]["code"] == "throttled"
    assert "try again in" in replies[3]["message"]
    stored = Message.objects.filter(session=session).count() + PendingInput.objects.filter(session=session).count()
    assert stored == 3 and not PendingInput.objects.filter(session=session, content="message 3").exists()
