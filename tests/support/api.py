"""Callers of the HTTP API and a small world of objects for them: the API through Django's test
client (every request through the real URL routing and middleware, never a bare router), or over
real HTTP against a server the test started."""

import contextlib
import json
from dataclasses import dataclass
from datetime import timedelta

import httpx
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from approvals_app.models import Approval, ApprovalPolicy
from runs_app.models import Run, RunStatus, StepStatus, WaitReason
from sessions_app.api_keys import api_key_revoke
from sessions_app.models import Session
from tests.support.factories import (
    ApiKeyFactory, ApprovalFactory, MessageFactory, RunEventFactory, RunFactory, SessionFactory, StepFactory,
    ToolCallFactory,
)
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect


OPERATOR_PERMISSIONS = [
    ("runs_app", "view_run"),
    ("runs_app", "change_run"),
    ("sessions_app", "view_session"),
    ("approvals_app", "decide_approval"),
    ("tools_app", "reconcile_toolcall"),
]


class Api:
    """A client speaking to /api/v1 as one caller (a bearer key, or none)."""

    def __init__(self, token: str | None = None, client: Client | None = None):
        self.client = client or Client()
        self.headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}

    def get(self, path: str, params=None, **headers):
        return self.client.get(f"/api/v1{path}", params or {}, **self.headers, **headers)

    @contextlib.contextmanager
    def stream(self, path: str, params=None, **headers):
        """An event stream's chunks; when the block ends the rest is read to the stream's end (give it
        a short max_seconds), so the test client closes it as it closes every stream it read. A stream
        left open is closed when it is garbage-collected — its close gives its stream slot back with a
        query, which, run at that moment inside another query on the same connection, waits for ever."""
        response = self.get(path, params, **headers)
        assert response.streaming, (response.status_code, response.content)
        chunks = iter(response.streaming_content)
        try:
            yield chunks
        finally:
            for _ in chunks:
                pass

    def post(self, path: str, body=None, **headers):
        data = "" if body is None else json.dumps(body)
        return self.client.post(f"/api/v1{path}", data, content_type="application/json", **self.headers, **headers)

    def patch(self, path: str, body=None, **headers):
        data = "" if body is None else json.dumps(body)
        return self.client.patch(f"/api/v1{path}", data, content_type="application/json", **self.headers, **headers)

    def request(self, method: str, path: str, body=None):
        return self.get(path) if method == "GET" else self.post(path, body)


def grant(user, *perms: tuple[str, str]):
    user.user_permissions.add(
        *[Permission.objects.get(content_type__app_label=app, codename=codename) for app, codename in perms]
    )
    # Django caches permissions on the instance; tests reuse the object.
    for cache in ("_perm_cache", "_user_perm_cache", "_group_perm_cache"):
        user.__dict__.pop(cache, None)
    return user


@dataclass
class World:
    """One user's objects, in the states the API acts on."""

    session: Session  # idle: its only run completed
    run: Run  # completed: a model step, a read and an applied write, events
    approval_run: Run  # waiting / approval (user-level confirmation)
    user_approval: Approval
    operator_run: Run  # waiting / approval (an operator must decide)
    operator_approval: Approval
    unknown_run: Run  # waiting / reconciliation
    unknown_call: ToolCall


def _with_events(run: Run, *types: str) -> Run:
    for seq, kind in enumerate(types, start=1):
        RunEventFactory(run=run, seq=seq, type=kind, payload={"status": f"s{seq}"})
    Run.objects.filter(pk=run.pk).update(event_seq=len(types))
    run.refresh_from_db()
    return run


def _waiting_run(owner, wait_reason: str) -> Run:
    return RunFactory(session=SessionFactory(owner=owner), status=RunStatus.WAITING, phase="", wait_reason=wait_reason)


def _pending_approval(run: Run, policy: str) -> Approval:
    step = StepFactory(run=run, index=0)
    call = ToolCallFactory(step=step, run=run, tool_name="execute_refund", effect=ToolEffect.WRITE,
                           arguments={"order_id": "9527", "amount": "10.00"})
    return ApprovalFactory(tool_call=call, run=run, policy=policy)


def build_world(owner) -> World:
    session = SessionFactory(owner=owner, title=f"{owner.username}'s refund")
    now = timezone.now()
    run = RunFactory(session=session, status=RunStatus.COMPLETED, phase="", finished_at=now, started_at=now - timedelta(seconds=5))
    MessageFactory(session=session, content="refund order 9527", run=run)
    MessageFactory(session=session, role="assistant", content="Done: refunded.", run=run)
    Session.objects.filter(pk=session.pk).update(message_seq=2)
    step = StepFactory(run=run, index=0, status=StepStatus.COMPLETED, finished_at=now, streamed_text="Let me check.")
    ToolCallFactory(step=step, run=run, index=0, status=ToolCallStatus.SUCCEEDED, finished_at=now, result={"eligible": True})
    ToolCallFactory(step=step, run=run, index=1, tool_name="execute_refund", effect=ToolEffect.WRITE,
                    status=ToolCallStatus.SUCCEEDED, finished_at=now, idempotency_key=f"refund:{run.pk}",
                    result={"refund_id": "r-1"})
    _with_events(run, "run_status", "tool_call", "tool_call", "run_status")

    approval_run = _with_events(_waiting_run(owner, WaitReason.APPROVAL), "run_status", "approval_requested")
    user_approval = _pending_approval(approval_run, ApprovalPolicy.USER)
    operator_run = _with_events(_waiting_run(owner, WaitReason.APPROVAL), "run_status", "approval_requested")
    operator_approval = _pending_approval(operator_run, ApprovalPolicy.OPERATOR)

    unknown_run = _with_events(_waiting_run(owner, WaitReason.RECONCILIATION), "run_status")
    unknown_call = ToolCallFactory(
        step=StepFactory(run=unknown_run, index=0), run=unknown_run, tool_name="ledger_transfer", effect=ToolEffect.WRITE,
        status=ToolCallStatus.UNKNOWN, idempotency_key=f"ledger:{unknown_run.pk}", finished_at=now,
    )
    return World(session, run, approval_run, user_approval, operator_run, operator_approval, unknown_run, unknown_call)


def revoked_key_api(owner) -> Api:
    key = ApiKeyFactory(owner=owner)
    api_key_revoke(api_key=key)
    return Api(key.secret)



class HttpApi:
    """A machine client of a real web server the test started: /api/v1 with a bearer key of `user`."""

    def __init__(self, base_url: str, user):
        self.client = httpx.Client(base_url=f"{base_url}/api/v1", timeout=30, trust_env=False,
                                   headers={"Authorization": f"Bearer {ApiKeyFactory(owner=user).secret}"})

    def post(self, path: str, body: dict | None = None, **headers):
        return self.client.post(path, json=body, headers=headers)

    def put(self, path: str, body: dict):
        return self.client.put(path, json=body)

    def get(self, path: str):
        return self.client.get(path)
