"""One access policy, the same answer everywhere (access.policy): for a customer, an
operator holding each single permission, a superuser and an inactive user, the HTTP API, the
console's pages, its websocket (a real daphne) and the admin desk each say whether the caller may
see a session and a run, cancel a run, decide an operator's and a customer's approval, and see and
reconcile a write whose outcome is unknown — and each agrees with the table below, which is
the policy written out. Four eyes holds everywhere: an operator in their own session decides no
operator approval and reconciles no write.

Every surface acts on a world of its own (a decision or a cancel changes it), owned by the
customer. The admin is the operators' desk: Django admits only active staff to it, so for
everyone else its every answer is "no", by design."""

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from approvals_app.models import Approval, ApprovalStatus
from runs_app.models import Run
from access import policy as access
from tests.support.api import Api, build_world
from tests.support.console import ConsoleSocket, open_socket
from tests.support.factories import ApiKeyFactory, UserFactory
from tools_app.models import ToolCall, ToolCallStatus

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

QUESTIONS = (
    "see_session", "see_run", "cancel_run", "decide_operator_approval", "decide_user_approval",
    "see_unknown_call", "reconcile_unknown_call",
)
POLICY = {
    #                      session run cancel op-appr user-appr call reconcile
    "customer":            (1,      1,  1,     0,      1,        1,   0),
    "view_run":            (1,      1,  0,     0,      0,        1,   0),
    "change_run":          (1,      1,  1,     0,      0,        1,   0),
    "view_session":        (1,      0,  0,     0,      0,        0,   0),
    "decide_approval":     (0,      0,  0,     1,      0,        0,   0),
    "reconcile_toolcall":  (0,      0,  0,     0,      0,        1,   1),
    "superuser":           (1,      1,  1,     1,      0,        1,   1),
    "inactive":            (0,      0,  0,     0,      0,        0,   0),
    # The customer is also staff with decide_approval and reconcile_toolcall: four eyes leaves
    # them what is theirs, and bars every decision about their own session's writes.
    "own_session_operator": (1,     1,  1,     0,      1,        1,   0),
}
PERMISSION_APPS = {"view_run": "runs_app", "change_run": "runs_app", "view_session": "sessions_app",
                   "decide_approval": "approvals_app", "reconcile_toolcall": "tools_app"}
# What each surface can be asked: the console shows sessions and runs, not the reconciliation queue.
SURFACE_QUESTIONS = {
    "policy": QUESTIONS,
    "api": QUESTIONS,
    "console": QUESTIONS[:5],
    "socket": QUESTIONS[:5],
    "admin": QUESTIONS,
}


def _caller(kind: str, customer):
    if kind == "customer":
        return customer
    if kind == "inactive":
        return customer  # the owner herself, deactivated after her world was built
    if kind == "superuser":
        return UserFactory(username="root", is_staff=True, is_superuser=True)
    if kind == "own_session_operator":
        customer.is_staff = True
        customer.save(update_fields=["is_staff"])
        customer.user_permissions.add(*Permission.objects.filter(codename__in=["decide_approval", "reconcile_toolcall"]))
        return customer
    user = UserFactory(username=f"op_{kind}", is_staff=True)
    user.user_permissions.add(Permission.objects.get(content_type__app_label=PERMISSION_APPS[kind], codename=kind))
    return user


def _policy(user, world) -> dict[str, bool]:
    operator_approval = Approval.objects.select_related("run__session").get(pk=world.operator_approval.pk)
    user_approval = Approval.objects.select_related("run__session").get(pk=world.user_approval.pk)
    unknown = ToolCall.objects.select_related("run__session").get(pk=world.unknown_call.pk)
    run = Run.objects.select_related("session").get(pk=world.run.pk)
    active = Run.objects.select_related("session").get(pk=world.operator_run.pk)
    return {
        "see_session": access.can_see_session(user=user, session=world.session),
        "see_run": access.can_see_run(user=user, run=run),
        "cancel_run": access.can_cancel_run(user=user, run=active),
        "decide_operator_approval": access.can_decide_approval(user=user, approval=operator_approval),
        "decide_user_approval": access.can_decide_approval(user=user, approval=user_approval),
        "see_unknown_call": access.can_see_tool_call(user=user, tool_call=unknown),
        "reconcile_unknown_call": access.can_reconcile_tool_call(user=user, tool_call=unknown),
    }


def _decided(approval) -> bool:
    return Approval.objects.get(pk=approval.pk).status == ApprovalStatus.REJECTED


def _cancel_requested(run) -> bool:
    return Run.objects.get(pk=run.pk).cancel_requested_at is not None


def _api(key: str, world) -> dict[str, bool]:
    api = Api(key)
    answers = {
        "see_session": api.get(f"/sessions/{world.session.pk}").status_code == 200,
        "see_run": api.get(f"/runs/{world.run.pk}").status_code == 200,
        "see_unknown_call": api.get(f"/tool-calls/{world.unknown_call.pk}").status_code == 200,
    }
    # Decisions before the cancel: cancelling the operator's run would withdraw its approval.
    answers["decide_operator_approval"] = api.post(f"/approvals/{world.operator_approval.pk}/decision",
                                                   {"decision": "reject", "note": "matrix"}).status_code == 200
    answers["decide_user_approval"] = api.post(f"/approvals/{world.user_approval.pk}/decision",
                                               {"decision": "reject", "note": "matrix"}).status_code == 200
    answers["cancel_run"] = api.post(f"/runs/{world.operator_run.pk}/cancel", {"reason": "matrix"}).status_code == 202
    answers["reconcile_unknown_call"] = api.post(f"/tool-calls/{world.unknown_call.pk}/resolve",
                                                 {"applied": False, "evidence": "matrix"}).status_code == 200
    return answers


def _console(client: Client, world) -> dict[str, bool]:
    answers = {
        "see_session": client.get(f"/console/sessions/{world.session.pk}/").status_code == 200,
        "see_run": client.get(f"/console/runs/{world.run.pk}/").status_code == 200,
    }
    # Decisions before the cancel: cancelling the operator's run would withdraw its approval.
    client.post(f"/console/approvals/{world.operator_approval.pk}/decide/", {"decision": "reject", "note": "matrix"})
    client.post(f"/console/approvals/{world.user_approval.pk}/decide/", {"decision": "reject", "note": "matrix"})
    client.post(f"/console/runs/{world.operator_run.pk}/cancel/", {"reason": "matrix"})
    answers["cancel_run"] = _cancel_requested(world.operator_run)
    answers["decide_operator_approval"] = _decided(world.operator_approval)
    answers["decide_user_approval"] = _decided(world.user_approval)
    return answers


def _socket(procs, user, world) -> dict[str, bool]:
    try:
        connection = open_socket(procs, user=user)
    except Exception:  # noqa: BLE001 - a refused handshake (an inactive user is anonymous): no to everything
        return dict.fromkeys(SURFACE_QUESTIONS["socket"], False)
    with ConsoleSocket(connection) as console:
        subscribed = console.subscribe(world.session.pk)
        answers = {
            "see_session": subscribed["type"] == "subscribed",
            "see_run": subscribed["type"] == "subscribed" and str(world.run.pk) in subscribed["runs"],
        }
        for question, action in (
            ("decide_operator_approval", {"action": "decide", "approval": str(world.operator_approval.pk), "decision": "reject", "note": "m"}),
            ("decide_user_approval", {"action": "decide", "approval": str(world.user_approval.pk), "decision": "reject", "note": "m"}),
            ("cancel_run", {"action": "cancel", "run": str(world.operator_run.pk), "reason": "matrix"}),
        ):
            console.send(**action, ref=question)
            reply = console.until(lambda m, q=question: m.get("ref") == q)
            answers[question] = reply["type"] in ("decided", "cancel_requested")
    return answers


def _admin(client: Client, world) -> dict[str, bool]:
    def shown(url) -> bool:
        return client.get(url).status_code == 200

    answers = {
        "see_session": shown(f"/admin/sessions_app/session/{world.session.pk}/change/"),
        "see_run": shown(f"/admin/runs_app/run/{world.run.pk}/change/"),
        "see_unknown_call": shown(f"/admin/tools_app/toolcall/{world.unknown_call.pk}/change/"),
    }
    client.post(f"/admin/approvals_app/approval/{world.operator_approval.pk}/reject/", {"note": "matrix"})
    client.post(f"/admin/approvals_app/approval/{world.user_approval.pk}/reject/", {"note": "matrix"})
    client.post(f"/admin/runs_app/run/{world.operator_run.pk}/cancel/", {"reason": "matrix"})
    client.post(f"/admin/tools_app/unknowntoolcall/{world.unknown_call.pk}/resolve/",
                {"outcome": "not_applied", "evidence": "matrix"})
    answers["decide_operator_approval"] = _decided(world.operator_approval)
    answers["decide_user_approval"] = _decided(world.user_approval)
    answers["cancel_run"] = _cancel_requested(world.operator_run)
    answers["reconcile_unknown_call"] = ToolCall.objects.get(pk=world.unknown_call.pk).status == ToolCallStatus.FAILED
    return answers


def _logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("kind", list(POLICY))
def test_every_surface_gives_the_policys_answer(kind, procs):
    customer = UserFactory(username="customer")
    worlds = {surface: build_world(customer) for surface in SURFACE_QUESTIONS}
    user = _caller(kind, customer)
    key = ApiKeyFactory(owner=user).secret
    console_client, admin_client = _logged_in(user), _logged_in(user)
    cookie_user = user
    if kind == "inactive":
        customer.is_active = False
        customer.save(update_fields=["is_active"])
        user.refresh_from_db()
    procs.start_web()

    answers = {
        "policy": _policy(user, worlds["policy"]),
        "api": _api(key, worlds["api"]),
        "console": _console(console_client, worlds["console"]),
        "socket": _socket(procs, cookie_user, worlds["socket"]),
        "admin": _admin(admin_client, worlds["admin"]),
    }

    expected = dict(zip(QUESTIONS, map(bool, POLICY[kind])))
    for surface, questions in SURFACE_QUESTIONS.items():
        wanted = {q: expected[q] and (surface != "admin" or (user.is_staff and user.is_active)) for q in questions}
        got = {q: answers[surface][q] for q in questions}
        assert got == wanted, f"{kind} on the {surface}: {got} != {wanted}"
