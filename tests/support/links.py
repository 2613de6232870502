"""Decision links and delegations as tests build them: a refund waiting for an operator (the desk's
scene, with the digest approval_request gives it), operators by name, and a link's page opened and
posted as a browser does — signed in, with the page's CSRF token."""

from datetime import timedelta

from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals_app.links import link_create, link_token
from approvals_app.models import Approval, ApprovalLink, LinkStage
from runs_app.models import WaitReason
from tests.support.desk import csrf_client, csrf_token_of, refund_scene, staff_user
from tests.support.factories import ApprovalFactory
from tools_app.models import ToolCallStatus
from tools_app.services import tool_call_digest


def operator_named(username: str, *, decides: bool = True):
    """Staff who see the desk; with `decides`, who may decide operator approvals too."""
    return staff_user(username, *(("decide_approval",) if decides else ()))


def refund_waiting(*, owner, required_approvals: int = 1) -> Approval:
    """Refund order 9527 (25.00 USD), waiting for an operator, in `owner`'s session."""
    scene = refund_scene(owner=owner, wait_reason=WaitReason.APPROVAL, refund_status=ToolCallStatus.PENDING)
    return ApprovalFactory(tool_call=scene.refund, run=scene.run, required_approvals=required_approvals,
                           digest=tool_call_digest(scene.refund), expires_at=timezone.now() + timedelta(hours=1))


def link_for(approval: Approval, decider, *, on_behalf_of=None) -> ApprovalLink:
    return link_create(approval=approval, decider=decider, stage=LinkStage.REQUESTED, on_behalf_of=on_behalf_of)


def link_path(link: ApprovalLink) -> str:
    return reverse("console:decide", kwargs={"token": link_token(link)})


def signed_in(user) -> Client:
    return csrf_client(user)


def link_decide(client: Client, link: ApprovalLink, decision: str = "approve", **fields):
    """Open the link's page and post its form, as a person clicking the button would. Every console
    page of someone signed in carries a CSRF token (the log-out form), buttons or not."""
    path = link_path(link)
    page = client.get(path)
    return client.post(path, {"decision": decision, "csrfmiddlewaretoken": csrf_token_of(page), **fields})
