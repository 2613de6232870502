"""The operators' desk as tests drive it: staff with and without permissions, a browser-like client
that must send CSRF tokens, and refund scenes built the way the engine leaves them."""

import re
from dataclasses import dataclass
from datetime import timedelta

from django.contrib.auth.models import Permission
from django.db import transaction
from django.test import Client
from django.utils import timezone

from approvals_app.models import Approval
from engine.actions.agents import agent_save
from engine.actions.sessions import session_open
from runs_app.models import Run, RunStatus, StepKind, StepStatus
from sessions_app.models import Message, MessageRole
from sessions_app.services import messages_append
from tests.support.api import grant
from tests.support.factories import RunFactory, SessionFactory, StepFactory, ToolCallFactory, UserFactory
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect

ORDER = {"order_id": "9527", "user_id": "u1", "amount": "25.00", "currency": "USD", "status": "delivered",
         "refund_eligible": True, "ineligible_reason": "", "refunded": False}
REFUND_ARGUMENTS = {"order_id": "9527", "amount": "25.00", "reason": "customer request"}


def staff_user(username: str, *codenames: str):
    """Staff who can see everything in the desk, plus the named permissions."""
    user = UserFactory(username=username, is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


def csrf_client(user) -> Client:
    """A browser-like client: logged in, and refused on any POST without the CSRF token."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def csrf_token_of(response) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', response.content.decode())
    assert match, "the page has no CSRF token"
    return match.group(1)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


@dataclass
class RefundScene:
    run: Run
    query: ToolCall
    refund: ToolCall
    approval: Approval | None = None


def refund_scene(*, owner, wait_reason: str, refund_status: str) -> RefundScene:
    """Check order 9527 and refund it: query_order answered, execute_refund proposed, the run
    suspended on `wait_reason` — rows and history as the engine writes them."""
    session = session_open(owner=owner, title="refund 9527")
    run = RunFactory(session=session, status=RunStatus.WAITING, phase="", wait_reason=wait_reason)
    first_model = StepFactory(run=run, index=0, kind=StepKind.MODEL, status=StepStatus.COMPLETED, finished_at=timezone.now())
    first_tools = StepFactory(run=run, index=1, kind=StepKind.TOOLS, status=StepStatus.COMPLETED, finished_at=timezone.now())
    second_model = StepFactory(run=run, index=2, kind=StepKind.MODEL, status=StepStatus.COMPLETED, finished_at=timezone.now())
    refund_tools = StepFactory(run=run, index=3, kind=StepKind.TOOLS)
    query = ToolCallFactory(
        run=run, step=first_tools, tool_call_id="call_q", tool_name="query_order", arguments={"order_id": "9527"},
        status=ToolCallStatus.SUCCEEDED, result=ORDER, attempts=1, finished_at=timezone.now(),
    )
    unknown = refund_status == ToolCallStatus.UNKNOWN
    refund = ToolCallFactory(
        run=run, step=refund_tools, tool_call_id="call_r", tool_name="execute_refund", arguments=REFUND_ARGUMENTS,
        effect=ToolEffect.WRITE, status=refund_status, idempotency_key=f"execute_refund:{run.pk}:refund:9527:25.00",
        attempts=1 if unknown else 0, finished_at=timezone.now() if unknown else None,
        error_code="outcome_unknown" if unknown else "", error_detail="no answer within 2.0s after sending" if unknown else "",
        next_attempt_at=timezone.now() + timedelta(hours=1) if unknown else None,
    )
    with transaction.atomic():
        messages_append(session_id=session.pk, messages=[
            Message(role=MessageRole.USER, content="Check order 9527 and refund it if it's eligible", run=run),
            Message(role=MessageRole.ASSISTANT, content="Let me look up order 9527.", run=run, step=first_model,
                    tool_calls=[{"id": "call_q", "name": "query_order", "arguments": '{"order_id": "9527"}'}]),
            Message(role=MessageRole.TOOL, content='{"order_id": "9527", "refund_eligible": true}', run=run,
                    tool_call_id="call_q", tool_name="query_order"),
            Message(role=MessageRole.ASSISTANT, content="Order 9527 is eligible; refunding it.", run=run, step=second_model,
                    tool_calls=[{"id": "call_r", "name": "execute_refund", "arguments": '{"order_id": "9527", "amount": "25.00"}'}]),
        ])
    return RefundScene(run=run, query=query, refund=refund)


# --- a refund with a history: the agent's limits and the same business key asked for before (issue 29) ---

REFUND_KEY = "execute_refund:refund:9527:25.00"
REFUND_LIMITS = {"execute_refund": [
    {"window": "24h", "per": "customer", "max_amount": "30.00", "over": "operator"},
    {"window": "1h", "per": "customer", "max_count": 5, "over": "refuse"},
]}


def refund_clerk(*, by, limits=None, budget_limits=None):
    """The demo's refund tools under an agent: its limits and budget maxima as given."""
    return agent_save(acting_user=grant(by, ("agents", "change_agent")), definition={
        "name": "Refund clerk", "slug": "refund-clerk", "instructions": "Refund what is eligible.", "provider": "scripted",
        "tools": ["query_order", "execute_refund"], "limits": limits or {}, "budget_limits": budget_limits or {},
    })


def refund_scene_with_history(*, owner, version, wait_reason: str, refund_status: str) -> RefundScene:
    """refund_scene, run by `version`'s agent, its refund holding its business key; earlier today the
    same customer had 10.00 USD refunded (order 9400, `scene.earlier`), and another run already asked
    for this very refund and failed (`scene.same_key`)."""
    scene = refund_scene(owner=owner, wait_reason=wait_reason, refund_status=refund_status)
    Run.objects.filter(pk=scene.run.pk).update(agent_version=version)
    ToolCall.objects.filter(pk=scene.refund.pk).update(business_key=REFUND_KEY)
    scene.refund.refresh_from_db()
    calls = []
    for arguments, status, key in (({"order_id": "9400", "amount": "10.00"}, ToolCallStatus.SUCCEEDED, "execute_refund:refund:9400:10.00"),
                                   ({"order_id": "9527", "amount": "25.00"}, ToolCallStatus.FAILED, REFUND_KEY)):
        run = RunFactory(session=SessionFactory(owner=owner), status=RunStatus.COMPLETED, phase="", finished_at=timezone.now(),
                         agent_version=version)
        calls.append(ToolCallFactory(run=run, step=StepFactory(run=run, kind=StepKind.TOOLS), tool_name="execute_refund",
                                     effect=ToolEffect.WRITE, arguments=arguments, status=status, finished_at=timezone.now(),
                                     business_key=key))
    scene.earlier, scene.same_key = calls
    return scene
