"""The console's server-rendered pages (with DEBUG off, as deployed): login, who sees which
session, what a run looks like, and the no-JavaScript fallbacks of the socket's actions."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals_app.models import ApprovalPolicy, ApprovalStatus
from runs_app.models import Run, RunEvent, RunStatus, StepKind, StepStatus, WaitReason
from engine.state import run_write
from sessions_app.models import PendingInput
from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from tests.support.factories import TEST_PASSWORD, ApprovalFactory, RunFactory, SessionFactory, StepFactory, ToolCallFactory, UserFactory
from tools_app.models import ToolCallStatus, ToolEffect

pytestmark = pytest.mark.django_db


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def page(client: Client, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200, (response.status_code, path)
    return response.content.decode()


def events(run, *items) -> None:
    """Append lifecycle events as the engine would (run_write allocates the seqs)."""
    from django.db import transaction

    with transaction.atomic():
        run_write(run_id=run.pk, events=list(items))


def test_the_console_requires_login_and_customers_can_log_in(settings):
    assert settings.DEBUG is False
    customer = UserFactory(username="carol")  # not staff: the admin's login would refuse her
    anonymous = Client()
    response = anonymous.get("/console/")
    assert response.status_code == 302 and response.url == "/console/login/?next=/console/"
    login = anonymous.get(response.url)
    assert login.status_code == 200
    response = anonymous.post("/console/login/?next=/console/", {"username": "carol", "password": TEST_PASSWORD, "next": "/console/"})
    assert response.status_code == 302 and response.url == "/console/"
    assert "Your sessions" in page(anonymous, "/console/")
    assert customer.is_staff is False


def test_a_user_cannot_open_another_users_session_or_run():
    owner, stranger = UserFactory(), UserFactory()
    session = session_open(owner=owner, title="mine alone")
    run = message_post(session=session, content="hello", acting_user=owner).run
    stranger_client = client_for(stranger)
    assert stranger_client.get(f"/console/sessions/{session.pk}/").status_code == 404
    assert stranger_client.get(f"/console/runs/{run.pk}/").status_code == 404
    assert stranger_client.post(f"/console/sessions/{session.pk}/messages/", {"content": "hi"}).status_code == 404
    assert stranger_client.post(f"/console/runs/{run.pk}/cancel/").status_code == 404
    assert "mine alone" not in page(stranger_client, "/console/")
    assert "mine alone" in page(client_for(owner), f"/console/sessions/{session.pk}/")


def test_an_operator_with_view_permission_may_watch_any_session():
    owner = UserFactory()
    operator = UserFactory(is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="view_run"))
    session = session_open(owner=owner, title="watched")
    html = page(client_for(operator), f"/console/sessions/{session.pk}/")
    assert "watching" in html and 'data-role="composer"' not in html  # watch, not write


def test_new_session_and_first_message_without_javascript():
    user = UserFactory()
    client = client_for(user)
    response = client.post("/console/sessions/new/", {"title": "refunds"})
    session_url = response.url
    response = client.post(session_url + "messages/", {"content": "What's the weather in Paris?", "mode": "auto"})
    assert response.status_code == 302 and response.url == session_url
    run = Run.objects.get(session__owner=user)
    html = page(client, session_url)
    assert f'id="run-{run.pk}"' in html and "What&#x27;s the weather in Paris?" in html
    assert 'data-last-seq="1"' in html  # the page knows which events it already shows
    assert 'class="composer busy"' in html  # a run is active: the interjection modes are offered
    for mode in ("auto", "supplement", "new_intent", "queue"):
        assert f'value="{mode}"' in html

    response = client.post(session_url + "messages/", {"content": "   "}, follow=True)
    assert "A message needs some text." in response.content.decode()
    client.post(session_url + "messages/", {"content": "and Rome too", "mode": "queue"})
    assert PendingInput.objects.get(session__owner=user).mode == "queue"
    assert "and Rome too" in page(client, session_url)


def test_a_waiting_refund_shows_tool_cards_and_waiting_for_an_operator():
    owner = UserFactory()
    operator = UserFactory(is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="view_run"))
    session = session_open(owner=owner, title="refund")
    run = RunFactory(session=session, status=RunStatus.WAITING, phase="", wait_reason=WaitReason.APPROVAL)
    tools = StepFactory(run=run, index=1, kind=StepKind.TOOLS)
    ToolCallFactory(step=tools, index=0, status=ToolCallStatus.SUCCEEDED, result={"order_id": "9527", "refund_eligible": True},
                    started_at=timezone.now(), finished_at=timezone.now())
    approval = ApprovalFactory(tool_call__step=tools, tool_call__index=1, policy=ApprovalPolicy.OPERATOR)
    events(run, ("run_status", {"status": "running", "phase": "executing_tools", "wait_reason": ""}),
           ("run_status", {"status": "waiting", "phase": "", "wait_reason": "approval"}))

    html = page(client_for(owner), f"/console/sessions/{session.pk}/")
    assert "query_order" in html and "execute_refund" in html and "refund_eligible" in html
    assert "status-succeeded" in html and "status-pending" in html
    assert '<span class="money" data-role="money">10.00 USD</span>' in html  # the refund's amount, in its currency
    assert "Waiting for an operator to approve this." in html
    assert "/admin/approvals_app/approval/" not in html  # the customer gets no admin link
    assert f'data-approval="{approval.pk}"' in html and "decide-form" not in html
    assert "<svg" in html and "waiting for approval" in html and "running tools" in html

    staff_html = page(client_for(operator), f"/console/sessions/{session.pk}/")
    assert 'href="/admin/approvals_app/approval/"' in staff_html


def test_a_user_level_confirmation_is_offered_to_the_owner_and_decided_without_javascript():
    owner = UserFactory()
    session = session_open(owner=owner, title="confirm")
    run = RunFactory(session=session, status=RunStatus.WAITING, phase="", wait_reason=WaitReason.APPROVAL)
    approval = ApprovalFactory(tool_call__step__run=run, policy=ApprovalPolicy.USER)
    client = client_for(owner)
    html = page(client, f"/console/sessions/{session.pk}/")
    assert "decide-form" in html and "Do you confirm?" in html
    response = client.post(f"/console/approvals/{approval.pk}/decide/", {"decision": "approve"})
    assert response.status_code == 302
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and approval.decided_by == owner
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED  # the same run resumes
    assert "Approved by" in page(client, f"/console/sessions/{session.pk}/")


def test_a_cancelled_run_lists_the_side_effects_it_already_applied():
    owner = UserFactory()
    session = session_open(owner=owner, title="cancelled")
    now = timezone.now()
    run = RunFactory(session=session, status=RunStatus.CANCELLED, phase="", finished_at=now)
    tools = StepFactory(run=run, index=1, kind=StepKind.TOOLS, status=StepStatus.COMPLETED, finished_at=now)
    ToolCallFactory(step=tools, tool_name="execute_refund", effect=ToolEffect.WRITE, status=ToolCallStatus.SUCCEEDED,
                    idempotency_key="execute_refund:abc", result={"refund_id": "rf_77", "amount": "25.00"},
                    started_at=now - timedelta(seconds=1), finished_at=now)
    html = page(client_for(owner), f"/console/sessions/{session.pk}/")
    assert "Side effects already applied" in html and "rf_77" in html and "execute_refund:abc" in html
    assert "Cancel run" not in html


def test_text_the_database_cannot_hold_or_too_long_is_refused_with_a_message_and_writes_nothing():
    """The same limits as the API: no NUL, no lone surrogates, no more than the field holds."""
    from sessions_app.models import Message, Session

    owner = UserFactory()
    client = client_for(owner)
    session = session_open(owner=owner, title="limits")
    run = message_post(session=session, content="hello", acting_user=owner).run
    before = (Session.objects.count(), Message.objects.count(), PendingInput.objects.count())

    response = client.post("/console/sessions/new/", {"title": "x" * 201}, follow=True)
    assert "The title may hold at most 200 characters." in response.content.decode()
    response = client.post(f"/console/sessions/{session.pk}/messages/", {"content": "a\x00b"}, follow=True)
    assert "The message must not contain NUL characters." in response.content.decode()
    response = client.post(f"/console/sessions/{session.pk}/messages/", {"content": "x" * 20_001}, follow=True)
    assert "The message may hold at most 20000 characters." in response.content.decode()
    response = client.post(f"/console/runs/{run.pk}/cancel/", {"reason": "stop\x00"}, follow=True)
    assert "The reason must not contain NUL characters." in response.content.decode()
    assert (Session.objects.count(), Message.objects.count(), PendingInput.objects.count()) == before
    run.refresh_from_db()
    assert run.cancel_requested_at is None and run.status == RunStatus.QUEUED


def test_cancel_without_javascript_goes_through_the_cancel_protocol():
    owner = UserFactory()
    session = session_open(owner=owner, title="stop")
    run = message_post(session=session, content="hello", acting_user=owner).run
    client_for(owner).post(f"/console/runs/{run.pk}/cancel/")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.cancel_requested_by == owner
    assert RunEvent.objects.filter(run=run, type="cancel_requested").exists()


def test_the_timeline_shows_where_the_time_went():
    from runs_app.timeline import duration_text, run_timeline

    owner = UserFactory()
    run = RunFactory(session=session_open(owner=owner), status=RunStatus.WAITING, phase="", wait_reason=WaitReason.APPROVAL)
    start = run.created_at
    marks = [
        (0, {"status": "queued", "phase": "waiting_worker", "wait_reason": ""}),
        (0.2, {"status": "running", "phase": "calling_model", "wait_reason": ""}),
        (1.4, {"status": "waiting", "phase": "", "wait_reason": "approval"}),
    ]
    timeline = run_timeline(
        run=run,
        events=[{"type": "run_status", "payload": p, "created_at": start + timedelta(seconds=s)} for s, p in marks],
        steps=[], calls=[], now=start + timedelta(seconds=61.4),
    )
    labels = [bar["title"] for bar in timeline["bars"]]
    assert labels == ["queued 200 ms", "calling model 1.2 s", "waiting: approval 1 m 00 s"]
    assert timeline["summary"][0] == "waiting: approval 1 m 00 s" and timeline["ongoing"]
    assert duration_text(3725) == "1 h 02 m"


def test_the_console_serves_its_own_assets_with_debug_off():
    for name in ("console.js", "console.css"):
        response = Client().get(f"/console/assets/{name}")
        assert response.status_code == 200
        assert b"".join(response.streaming_content)


def test_the_root_leads_to_the_console_and_every_page_has_a_favicon():
    anonymous = Client()
    root = anonymous.get("/")
    assert root.status_code == 302 and root["Location"] == reverse("console:home")
    icon = anonymous.get("/favicon.ico")
    assert icon.status_code == 200 and icon["Content-Type"] == "image/svg+xml" and b"<svg" in b"".join(icon.streaming_content)
    login = anonymous.get(reverse("console:login")).content.decode()
    assert 'rel="icon"' in login


def test_a_wrong_password_keeps_the_username():
    UserFactory(username="carol")
    page = Client().post(reverse("console:login"), {"username": "carol", "password": "wrong"}).content.decode()
    assert "didn&#x27;t match" in page or "didn't match" in page
    assert 'name="username" value="carol"' in page


def test_the_sidebar_badges_come_from_the_sessions_active_runs():
    owner = UserFactory(username="erin")
    busy, idle = SessionFactory(owner=owner, title="busy"), SessionFactory(owner=owner, title="idle")
    RunFactory(session=busy, status=RunStatus.WAITING, phase="", wait_reason="approval")
    SessionFactory(title="someone else's")
    client = Client()
    client.force_login(owner)
    states = client.get(reverse("console:session_states")).json()["sessions"]
    assert states == {str(busy.pk): "waiting", str(idle.pk): None}
    assert Client().get(reverse("console:session_states")).status_code == 302  # login required
