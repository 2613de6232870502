"""The authorization matrix: every endpoint × every kind of object × every kind of caller.

Alice owns the objects. The callers: alice (owner), bob (another user with objects of his
own), an operator holding the five operator permissions, a staff member holding none,
anonymous, and alice's own revoked key. Each case asserts the status code and the database:
a refused call (401/403/404) and every read change nothing; an allowed write changes it.
Nothing of alice's leaks to bob or to the permissionless staff member, in details or lists.
"""

import json

import pytest
from django.utils.dateparse import parse_datetime
from django_q.models import OrmQ

from approvals_app.models import Approval, AuditEntry
from api.v1 import api
from runs_app.models import TERMINAL_STATUSES, ModelEndpoint, Run, RunEvent
from engine.actions.cancel import run_cancel_request
from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from sessions_app.models import InputDisposition, InputMode, Message, PendingInput, Session
from tests.support.api import OPERATOR_PERMISSIONS, Api, build_world, grant, revoked_key_api
from tests.support.factories import ApiKeyFactory, ModelEndpointFactory, UserFactory
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = pytest.mark.django_db

CALLERS = ["owner", "other_user", "operator", "staff_without_permissions", "anonymous", "revoked_key"]

# Object-addressed endpoints, each with the World attributes of every object kind it takes.
RUNS = ["run", "approval_run", "operator_run", "unknown_run"]
CALLS = ["read_call", "applied_write_call", "unknown_call", "awaiting_approval_call"]
APPROVALS = ["user_approval", "operator_approval"]
SESSIONS = ["session", "busy_session"]
OBJECT_ENDPOINTS = {
    ("GET", "/sessions/{session_id}"): SESSIONS,
    ("GET", "/sessions/{session_id}/messages"): SESSIONS,
    ("POST", "/sessions/{session_id}/messages"): SESSIONS,
    ("GET", "/sessions/{session_id}/events"): SESSIONS,
    ("GET", "/runs/{run_id}"): RUNS,
    ("GET", "/runs/{run_id}/events"): RUNS,
    ("GET", "/runs/{run_id}/events/stream"): ["run"],  # a live run's stream would wait for events
    ("POST", "/runs/{run_id}/cancel"): RUNS,
    ("POST", "/runs/{run_id}/retry"): RUNS,
    ("POST", "/runs/{run_id}/fork"): RUNS,
    ("GET", "/tool-calls/{tool_call_id}"): CALLS,
    ("POST", "/tool-calls/{tool_call_id}/resolve"): CALLS,
    ("POST", "/tool-calls/{tool_call_id}/reconcile"): CALLS,
    ("GET", "/approvals/{approval_id}"): APPROVALS,
    ("POST", "/approvals/{approval_id}/decision"): APPROVALS,
    ("POST", "/approvals/{approval_id}/edit"): APPROVALS,
}
# Collection endpoints: what they list must be exactly what the caller may see.
LIST_ENDPOINTS = {
    ("GET", "/sessions"): {},
    ("GET", "/runs"): {},
    ("GET", "/tool-calls"): {},
    ("GET", "/approvals"): {"decidable": "false", "status": ["pending", "approved", "rejected", "expired", "withdrawn"]},
}
# Endpoints that address no existing object.
OTHER_ENDPOINTS = {("GET", "/me"), ("POST", "/sessions")}
# The deployment's agents: everyone signed in reads them (to pick one); defining one or saving a
# new version needs agents.change_agent, which no caller of the matrix has.
AGENT_ENDPOINTS = {("GET", "/agents"), ("GET", "/agents/{slug}"), ("POST", "/agents"), ("PUT", "/agents/{slug}")}
# Freezing money movement needs approvals_app.freeze_money, which no caller of the matrix has.
FREEZE_ENDPOINTS = {("GET", "/freezes"), ("POST", "/freezes"), ("POST", "/freezes/{freeze_id}/lift")}
# Streams that never end by themselves (a session's, every run's), and every run's events, which
# need runs_app.follow_all_events: no caller of the matrix has it.
FEED_ENDPOINTS = {("GET", "/sessions/{session_id}/events/stream"), ("GET", "/events"), ("GET", "/events/stream")}
# The tamper-evident ledger: every session's decisions and write outcomes, for an auditor's key
# (approvals_app.export_ledger), which no caller of the matrix has.
LEDGER_ENDPOINTS = {("GET", "/ledger")}
# Model endpoints: reading needs runs_app.view_modelendpoint, defining runs_app.change_modelendpoint (or,
# to read, agents.change_agent); no caller of the matrix has any.
MODEL_ENDPOINT_ENDPOINTS = {("GET", "/model-endpoints"), ("GET", "/model-endpoints/{name}"), ("POST", "/model-endpoints"),
                            ("PATCH", "/model-endpoints/{name}")}

# Out-of-office delegations are the caller's own: nobody lists or revokes another's; naming a stand-in
# needs approvals_app.decide_approval, which only the operator of the matrix has.
DELEGATION_ENDPOINTS = {("GET", "/me/delegations"), ("POST", "/me/delegations"),
                        ("POST", "/me/delegations/{delegation_id}/revoke")}
# Input held from a cancelled run: only the session's owner chooses what becomes of it.
HELD_INPUT_ENDPOINTS = {("POST", "/sessions/{session_id}/held-inputs/{input_id}/send"),
                        ("POST", "/sessions/{session_id}/held-inputs/{input_id}/drop")}

BODIES = {
    "/sessions/{session_id}/messages": {"content": "and refund order 9528 too", "mode": "queue"},
    "/runs/{run_id}/cancel": {"reason": "customer changed their mind"},
    "/runs/{run_id}/retry": {"reason": "try again"},
    "/runs/{run_id}/fork": {"reason": "replay it"},
    "/approvals/{approval_id}/edit": {"arguments": {"order_id": "9527", "amount": "8.00"}, "reason": "agreed 8.00"},
    "/tool-calls/{tool_call_id}/resolve": {"applied": True, "evidence": "ledger entry L-1"},
    "/tool-calls/{tool_call_id}/reconcile": None,
    "/approvals/{approval_id}/decision": {"decision": "approve", "note": "checked"},
}


def test_the_matrix_covers_every_endpoint_of_the_api():
    schema = api.get_openapi_schema(path_prefix="")
    served = {(method.upper(), path) for path, operations in schema["paths"].items() for method in operations}
    assert served == (set(OBJECT_ENDPOINTS) | set(LIST_ENDPOINTS) | OTHER_ENDPOINTS | AGENT_ENDPOINTS | FREEZE_ENDPOINTS
                      | FEED_ENDPOINTS | LEDGER_ENDPOINTS | MODEL_ENDPOINT_ENDPOINTS | DELEGATION_ENDPOINTS
                      | HELD_INPUT_ENDPOINTS)


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("method,path", sorted(HELD_INPUT_ENDPOINTS), ids=[p.rsplit("/", 1)[1] for _, p in sorted(HELD_INPUT_ENDPOINTS)])
def test_only_the_sessions_owner_sends_or_drops_its_held_input(caller, method, path, django_capture_on_commit_callbacks):
    scene = Scene()
    session = session_open(owner=scene.alice, title="held")
    run = message_post(session=session, content="refund order 9527", acting_user=scene.alice).run
    held = message_post(session=session, content="and 9528", mode=InputMode.SUPPLEMENT, acting_user=scene.alice).pending_input
    run_cancel_request(run=run, acting_user=scene.alice)  # queued: cancelled at once, the supplement held
    before = database_state()
    with django_capture_on_commit_callbacks(execute=True):
        response = scene.callers[caller].post(path.format(session_id=session.pk, input_id=held.pk), {})
    want = {"owner": 201 if path.endswith("/send") else 200, "operator": 403, "anonymous": 401,
            "revoked_key": 401}.get(caller, 404)
    assert response.status_code == want, response.content
    held.refresh_from_db()
    if want >= 400:
        assert response.json()["code"] and "and 9528" not in response.content.decode()
        assert database_state() == before and held.disposition == InputDisposition.HELD
    else:
        assert held.disposition == (InputDisposition.NEW_RUN if path.endswith("/send") else InputDisposition.DISCARDED)


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize(("method", "path"), sorted(FEED_ENDPOINTS))
def test_many_runs_feeds_answer_as_the_session_detail_and_need_their_permission(caller, method, path):
    scene = Scene()
    session = scene.world.session
    response = scene.callers[caller].get(path.format(session_id=session.pk), {"max_seconds": 1} if "stream" in path else {})
    if caller in ("anonymous", "revoked_key"):
        want = 401
    elif not path.startswith("/sessions"):
        want = 403
    else:
        want = 200 if caller in ("owner", "operator") else 404
    assert response.status_code == want, caller
    if want == 200:
        stream = iter(response.streaming_content)
        assert next(stream) == b"retry: 2000\n\n" and next(stream).startswith(b"id: ")
    else:
        assert response.json()["code"] and str(session.pk) not in response.content.decode()


@pytest.mark.parametrize("caller", CALLERS)
def test_no_caller_without_the_export_permission_reads_the_ledger(caller):
    scene = Scene()
    approval = scene.world.user_approval
    assert scene.callers["owner"].post(f"/approvals/{approval.pk}/decision", {"decision": "approve"}).status_code == 200
    response = scene.callers[caller].get("/ledger")  # the decision is on the ledger now
    assert response.status_code == (401 if caller in ("anonymous", "revoked_key") else 403), caller
    assert response.json()["code"] and str(approval.pk) not in response.content.decode()


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize(("method", "path"), sorted(FREEZE_ENDPOINTS))
def test_no_caller_without_the_freeze_permission_reads_sets_or_lifts_a_freeze(caller, method, path):
    from approvals_app.models import Freeze
    from engine.actions.freezes import freeze_set

    scene = Scene()
    holder = grant(UserFactory(username="on-call", is_staff=True), ("approvals_app", "freeze_money"))
    freeze = freeze_set(scope="customer", target="alice", reason="review", acting_user=holder)
    api_client = scene.callers[caller]
    url = path.replace("{freeze_id}", str(freeze.pk))
    body = {"scope": "customer", "target": "bob", "reason": "x"} if path == "/freezes" else {"note": "done"}
    response = api_client.get(url) if method == "GET" else api_client.post(url, body)
    assert response.status_code == (401 if caller in ("anonymous", "revoked_key") else 403), (caller, response.content)
    assert list(Freeze.objects.values_list("target", "lifted_at")) == [("alice", None)]


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize(("method", "path"), sorted(DELEGATION_ENDPOINTS))
def test_delegations_are_the_callers_own_and_naming_a_stand_in_needs_the_decide_permission(caller, method, path):
    from datetime import timedelta

    from django.utils import timezone

    from approvals_app.models import Delegation
    from engine.actions.delegations import delegation_set

    scene = Scene()
    away = grant(UserFactory(username="away", is_staff=True), ("approvals_app", "decide_approval"))
    stand_in = UserFactory(username="stand-in", is_staff=True)
    theirs = delegation_set(delegator=away, delegate=stand_in, starts_at=None, ends_at=timezone.now() + timedelta(days=1),
                            reason="leave", acting_user=away)
    api_client = scene.callers[caller]
    url = path.replace("{delegation_id}", str(theirs.pk))
    body = {"delegate": "stand-in", "ends_at": (timezone.now() + timedelta(days=2)).isoformat()}
    response = api_client.get(url) if method == "GET" else api_client.post(url, body if path == "/me/delegations" else None)
    if caller in ("anonymous", "revoked_key"):
        want = 401
    elif method == "GET":
        want = 200
    elif path == "/me/delegations":
        want = 201 if caller == "operator" else 403
    else:
        want = 404  # someone else's, reported like a missing one
    assert response.status_code == want, (caller, response.content)
    if want == 200:
        assert response.json() == []
    assert list(Delegation.objects.filter(revoked_at__isnull=True).values_list("delegator__username", flat=True).order_by("id")) == (
        ["away", "operator"] if want == 201 else ["away"])


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize(("method", "path"), sorted(MODEL_ENDPOINT_ENDPOINTS))
def test_no_caller_without_the_endpoint_permissions_reads_or_defines_a_model_endpoint(caller, method, path):
    scene = Scene()
    endpoint = ModelEndpointFactory(name="team-a", credential="sk-matrix-secret-0123456789")
    before = list(ModelEndpoint.objects.values())
    api_client = scene.callers[caller]
    url = path.replace("{name}", "team-a")
    body = {"name": "team-b", "base_url": "https://models.example.com/v1", "credential": "sk-other-secret-0123"}
    response = {"GET": lambda: api_client.get(url), "POST": lambda: api_client.post(url, body),
                "PATCH": lambda: api_client.patch(url, {"credential": "sk-other-secret-0123"})}[method]()
    assert response.status_code == (401 if caller in ("anonymous", "revoked_key") else 403), (caller, response.content)
    assert response.json()["code"] and "secret" not in response.content.decode()
    assert endpoint.credential not in response.content.decode()
    assert list(ModelEndpoint.objects.values()) == before


class Scene:
    """Alice's world, bob's world and every caller."""

    def __init__(self, *, with_bobs_world: bool = False):
        self.alice = UserFactory(username="alice")
        self.bob = UserFactory(username="bob")
        self.world = build_world(self.alice)
        if with_bobs_world:
            build_world(self.bob)
        operator = grant(UserFactory(username="operator", is_staff=True), *OPERATOR_PERMISSIONS)
        staff = UserFactory(username="staff", is_staff=True)
        self.callers = {
            "owner": Api(ApiKeyFactory(owner=self.alice).secret),
            "other_user": Api(ApiKeyFactory(owner=self.bob).secret),
            "operator": Api(ApiKeyFactory(owner=operator).secret),
            "staff_without_permissions": Api(ApiKeyFactory(owner=staff).secret),
            "anonymous": Api(),
            "revoked_key": revoked_key_api(self.alice),
        }
        w = self.world
        calls = list(ToolCall.objects.filter(run=w.run).order_by("index"))
        self.objects = {
            "session": w.session,
            "busy_session": w.approval_run.session,
            "run": w.run,
            "approval_run": w.approval_run,
            "operator_run": w.operator_run,
            "unknown_run": w.unknown_run,
            "read_call": calls[0],
            "applied_write_call": calls[1],
            "unknown_call": w.unknown_call,
            "awaiting_approval_call": w.user_approval.tool_call,
            "user_approval": w.user_approval,
            "operator_approval": w.operator_approval,
        }

    def alice_ids(self) -> set[str]:
        w = self.world
        sessions = Session.objects.filter(owner=self.alice).values_list("id", flat=True)
        runs = Run.objects.filter(session__owner=self.alice).values_list("id", flat=True)
        calls = ToolCall.objects.filter(run__session__owner=self.alice).values_list("id", flat=True)
        approvals = Approval.objects.filter(run__session__owner=self.alice).values_list("id", flat=True)
        assert w.session.pk in set(sessions)
        return {str(pk) for pk in [*sessions, *runs, *calls, *approvals]}


def database_state() -> tuple:
    """Every fact a request could change (ApiKey.last_used_at aside)."""
    return (
        Session.objects.count(), Message.objects.count(), PendingInput.objects.count(), RunEvent.objects.count(),
        AuditEntry.objects.count(), OrmQ.objects.count(),
        sorted(Run.objects.values_list("id", "status", "phase", "wait_reason", "cancel_requested_at")),
        sorted(ToolCall.objects.values_list("id", "status", "resolution")),
        sorted(Approval.objects.values_list("id", "status", "decided_by")),
    )


def expected_status(*, method: str, path: str, kind: str, caller: str, obj) -> int:
    if caller in ("anonymous", "revoked_key"):
        return 401
    if caller in ("other_user", "staff_without_permissions"):
        return 404
    owner = caller == "owner"
    if method == "GET":
        return 200
    if path.endswith("/messages"):
        if not owner:
            return 403
        return 202 if kind == "busy_session" else 201
    if path.endswith("/cancel"):
        return 409 if obj.status in TERMINAL_STATUSES else 202
    if path.endswith("/retry"):
        return 409  # none of the world's runs failed or was cancelled
    if path.endswith("/fork"):
        return 201 if obj.status in TERMINAL_STATUSES else 409
    if path.endswith("/edit"):
        # An operator's request, edited by an operator; a customer's confirmation is never edited.
        return 200 if kind == "operator_approval" and not owner else 403
    if path.startswith("/tool-calls"):
        if owner:
            return 403  # seeing your own call is not the power to reconcile it
        return 200 if obj.status == ToolCallStatus.UNKNOWN else 409
    if path.endswith("/decision"):
        return 200 if (kind == "user_approval") == owner else 403
    raise AssertionError(f"no rule for {method} {path}")


def read_shows_the_object(path: str, obj, body: str) -> bool:
    if path.endswith("/messages"):
        return len(json.loads(body)["items"]) == Message.objects.filter(session=obj).count()
    if path.endswith("/events"):
        events = RunEvent.objects.filter(run__session=obj) if path.startswith("/sessions") else RunEvent.objects.filter(run=obj)
        return len(json.loads(body)["items"]) == events.count()
    if path.endswith("/stream"):
        return body.count("\nid: ") + body.startswith("id: ") == RunEvent.objects.filter(run=obj).count()
    return str(obj.pk) in body


MATRIX = [
    (method, path, kind, caller)
    for (method, path), kinds in OBJECT_ENDPOINTS.items()
    for kind in kinds
    for caller in CALLERS
]


@pytest.mark.parametrize("method,path,kind,caller", MATRIX, ids=[f"{m} {p} {k} as {c}" for m, p, k, c in MATRIX])
def test_object_endpoint(method, path, kind, caller, django_capture_on_commit_callbacks):
    scene = Scene()
    obj = scene.objects[kind]
    url = path.format(**{name: obj.pk for name in ("session_id", "run_id", "tool_call_id", "approval_id")})
    want = expected_status(method=method, path=path, kind=kind, caller=caller, obj=obj)
    before = database_state()
    with django_capture_on_commit_callbacks(execute=True):
        response = scene.callers[caller].request(method, url, BODIES.get(path))
    body = b"".join(response.streaming_content) if response.streaming else response.content
    assert response.status_code == want, body[:500]
    after = database_state()
    if want >= 400:
        assert response["Content-Type"].startswith("application/json")
        assert set(response.json()) >= {"code", "message"}
        assert str(obj.pk) not in body.decode()  # a refusal tells nothing about the object
        assert after == before, "a refused request changed the database"
    elif method == "GET":
        assert read_shows_the_object(path, obj, body.decode())
        assert after == before, "a read changed the database"
    elif path.endswith("/reconcile"):
        # Allowed; the test tool has no reconcile lookup, so the call stays for an operator.
        # The only change is the audit entry naming who asked.
        assert response.json()["outcome"] == "manual"
        assert after[4] == before[4] + 1
        assert after[:4] + after[5:] == before[:4] + before[5:]
    else:
        assert after != before, "an allowed write changed nothing"


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("method,path", list(LIST_ENDPOINTS), ids=[p for _, p in LIST_ENDPOINTS])
def test_lists_show_exactly_what_the_caller_may_see(method, path, caller):
    scene = Scene(with_bobs_world=True)
    before = database_state()
    response = scene.callers[caller].get(path, {"limit": 200, **LIST_ENDPOINTS[(method, path)]})
    assert database_state() == before
    if caller in ("anonymous", "revoked_key"):
        assert response.status_code == 401
        return
    assert response.status_code == 200
    listed = {item["id"] for item in response.json()["items"]}
    alice_ids = scene.alice_ids()
    if caller in ("other_user", "staff_without_permissions"):
        assert not listed & alice_ids, "another user's objects leaked into the list"
        if caller == "other_user":
            assert listed, "bob sees his own objects"
    else:
        # Owner and operator both see all of alice's objects of this kind.
        kind_ids = {str(pk) for pk in _ids_of_kind(path, scene.alice)}
        assert kind_ids and kind_ids <= listed
        if caller == "owner":
            assert not listed - alice_ids, "alice sees only her own objects"


def _ids_of_kind(path: str, owner):
    if path == "/sessions":
        return Session.objects.filter(owner=owner).values_list("id", flat=True)
    if path == "/runs":
        return Run.objects.filter(session__owner=owner).values_list("id", flat=True)
    if path == "/tool-calls":
        return ToolCall.objects.filter(run__session__owner=owner).values_list("id", flat=True)
    return Approval.objects.filter(run__session__owner=owner).values_list("id", flat=True)


@pytest.mark.parametrize("caller", CALLERS)
def test_me_and_session_create_need_a_valid_identity(caller):
    scene = Scene()
    api_client = scene.callers[caller]
    before = Session.objects.count()
    me = api_client.get("/me")
    created = api_client.post("/sessions", {"title": "new"})
    if caller in ("anonymous", "revoked_key"):
        assert (me.status_code, created.status_code) == (401, 401)
        assert Session.objects.count() == before
        return
    assert me.status_code == 200
    assert created.status_code == 201
    # A new session always belongs to the caller, whoever they are.
    assert created.json()["owner"] == me.json()["username"]
    assert parse_datetime(created.json()["created_at"]) is not None


@pytest.mark.parametrize("caller", CALLERS)
def test_agents_are_read_by_everyone_signed_in_and_defined_by_nobody_without_the_permission(caller):
    from engine.actions.agents import agent_save
    from agents.models import Agent, AgentVersion

    scene = Scene()
    admin = grant(UserFactory(username="agent-admin"), ("agents", "change_agent"))
    agent_save(definition={"name": "Refunds", "slug": "refunds", "instructions": "Refund eligible orders.",
                           "provider": "scripted", "tools": ["query_order"]}, acting_user=admin)
    before = (Agent.objects.count(), AgentVersion.objects.count())
    api_client = scene.callers[caller]
    definition = {"name": "Mine", "slug": "mine", "instructions": "x", "provider": "scripted", "tools": ["query_order"]}
    answers = [api_client.get("/agents").status_code, api_client.get("/agents/refunds").status_code,
               api_client.post("/agents", definition).status_code, api_client.client.put("/api/v1/agents/refunds", json.dumps(definition), content_type="application/json",
                                    **api_client.headers).status_code]
    if caller in ("anonymous", "revoked_key"):
        assert answers == [401, 401, 401, 401]
    else:
        assert answers == [200, 200, 403, 403]
    assert (Agent.objects.count(), AgentVersion.objects.count()) == before
