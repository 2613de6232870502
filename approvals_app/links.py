"""Signed, single-use, expiring decision links (docs/NOTIFICATIONS.md).

A notification carries one link per decider: `<WARDEN_PUBLIC_URL>/console/decide/<token>/`, the
token being the link's id signed with the deployment's SECRET_KEY (django.core.signing, a salt of
its own), so a token nobody issued — or one with a character changed — is refused before any row
is read. The row binds the link to its approval, its decider (and whom they stand in for) and the
digest of the call as it was put to them; it is spent (`used_at`) in the transaction of the
decision it carries (engine.actions.approvals.approval_decide), so it decides at most once. A GET
never decides.
"""

from datetime import timedelta

from django.conf import settings
from django.core import signing
from django.utils import timezone

from approvals_app.models import Approval, ApprovalLink, ApprovalStatus

_SALT = "warden.approval-link"


class LinkTampered(Exception):
    """A token that is not one Warden signed."""


def link_create(*, approval: Approval, decider, stage: str, on_behalf_of=None) -> ApprovalLink:
    """A link for `decider` (in the caller's transaction), open until the approval expires or
    WARDEN_APPROVAL_LINK_TTL_SECONDS pass, whichever is first."""
    expires_at = min(approval.expires_at, timezone.now() + timedelta(seconds=settings.WARDEN_APPROVAL_LINK_TTL_SECONDS))
    return ApprovalLink.objects.create(approval=approval, decider=decider, on_behalf_of=on_behalf_of,
                                       digest=approval.digest, stage=stage, expires_at=expires_at)


def link_token(link: ApprovalLink) -> str:
    return signing.Signer(salt=_SALT).sign(str(link.pk))


def link_url(link: ApprovalLink) -> str:
    return f"{settings.WARDEN_PUBLIC_URL}/console/decide/{link_token(link)}/"


def link_from_token(token: str) -> ApprovalLink | None:
    """The link a token names; LinkTampered for a token Warden did not sign; None for a signed id
    with no row (erased)."""
    try:
        link_id = signing.Signer(salt=_SALT).unsign(token or "")
    except signing.BadSignature:
        raise LinkTampered("This link is not one Warden sent: it was altered or cut short. It decides nothing.") from None
    return (ApprovalLink.objects.select_related("approval__run__session", "approval__tool_call", "decider", "on_behalf_of")
            .filter(pk=link_id).first())


def why_link_unusable(*, link: ApprovalLink, user, now=None) -> str:
    """'' when `link` may carry `user`'s decision now, otherwise why not, in words for the page. (The
    access policy is asked besides: a usable link gives no power its decider has not.)"""
    now = now or timezone.now()
    approval = link.approval
    if link.used_at is not None:
        return (f"This link was already used, at {_clock(link.used_at)}: a link decides once. "
                "The request's page on the desk shows what became of it.")
    if approval.status == ApprovalStatus.WITHDRAWN:
        return "The run was cancelled and this request withdrawn: there is nothing left to decide."
    if approval.status != ApprovalStatus.PENDING:
        who = f" by {approval.decided_by.get_username()}" if approval.decided_by_id else ""
        return f"This request is already {approval.status}{who}: the link decides nothing."
    if approval.expires_at <= now:
        return f"This request expired at {_clock(approval.expires_at)}: it can no longer be decided."
    if link.expires_at <= now:
        return f"This link expired at {_clock(link.expires_at)}. The request is still open on the desk."
    if link.digest != approval.digest:
        return ("The request changed after this link was sent (an operator edited it): this link decides nothing. "
                "Open the request on the desk to see it as it stands.")
    if user.pk != link.decider_id:
        return (f"This link was sent to {link.decider.get_username()}: sign in as them, or use the link sent to you.")
    return ""


def _clock(moment) -> str:
    return timezone.localtime(moment).strftime("%H:%M:%S %Z, %d %b %Y")
