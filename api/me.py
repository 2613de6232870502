"""GET /me: the caller, and the operator permissions that widen what the API shows them; /me/delegations:
the caller's out-of-office delegations."""

from datetime import datetime

from django.contrib.auth import get_user_model
from django.db.models import Q
from django.utils import timezone
from ninja import Field, Router, Schema, Status
from pydantic import AwareDatetime

from access import policy as access
from api.base import COMMON_ERRORS, BodyIn, StorableText, errors
from api.errors import not_found
from approvals_app.errors import ApprovalRefusal
from approvals_app.models import Delegation
from config.errors import WardenError
from engine.actions.delegations import delegation_manager_check, delegation_revoke, delegation_set

router = Router(tags=["me"])


class PermissionsOut(Schema):
    view_any_run: bool
    cancel_any_run: bool
    view_any_session: bool
    decide_operator_approvals: bool
    reconcile_tool_calls: bool
    manage_agents: bool


class MeOut(Schema):
    username: str
    permissions: PermissionsOut



@router.get("", response={200: MeOut, **errors(400, 401)}, summary="Who am I")
def me(request):
    """The authenticated user and the operator permissions that widen what the API shows."""
    user = request.auth
    return {
        "username": user.get_username(),
        "permissions": access.operator_powers(user),
    }


# --- out-of-office delegations (issue 31, point 3) -------------------------------------------------
# The caller's own: the stand-ins they named and the people they stand in for. Set and revoked
# through engine.actions.delegations, as on the desk — audited and on the ledger.


class DelegationOut(Schema):
    id: int
    delegator: str = Field(description="whose decisions are delegated")
    delegate: str = Field(description="who stands in; their decisions record both names")
    starts_at: datetime
    ends_at: datetime
    reason: str
    created_by: str
    created_at: datetime
    revoked_at: datetime | None
    in_force: bool

    @staticmethod
    def resolve_delegator(delegation) -> str:
        return delegation.delegator.get_username()

    @staticmethod
    def resolve_delegate(delegation) -> str:
        return delegation.delegate.get_username()

    @staticmethod
    def resolve_created_by(delegation) -> str:
        return delegation.created_by.get_username()

    @staticmethod
    def resolve_in_force(delegation) -> bool:
        return delegation.revoked_at is None and delegation.starts_at <= timezone.now() < delegation.ends_at


class DelegationIn(BodyIn):
    delegate: StorableText = Field(max_length=150, description="the stand-in's username")
    ends_at: AwareDatetime = Field(description="when it ends, with its time zone; at most 90 days after the start")
    starts_at: AwareDatetime | None = Field(None, description="when it starts, with its time zone; now when left out")
    reason: StorableText = Field("", max_length=300, description="why; kept in the audit trail and the ledger")
    delegator: StorableText | None = Field(None, max_length=150,
                                           description="whose decisions: a superuser may name anyone; left out, the caller")


def _person(username: str | None, *, field: str):
    user = get_user_model().objects.filter(username=username).first() if username else None
    if user is None:
        message = f"no user {username!r}"
        raise WardenError(ApprovalRefusal.INVALID_DELEGATION, f"The delegation was refused, nothing was set: {field}: {message}",
                          fields=[{"field": f"body.{field}", "message": message,
                                   "type": ApprovalRefusal.INVALID_DELEGATION.value}])
    return user


@router.get("/delegations", response={200: list[DelegationOut], **COMMON_ERRORS},
            summary="My delegations, given and held")
def delegations_list(request):
    """The stand-ins the caller named and the delegations naming the caller as stand-in, latest first."""
    user = request.auth
    return list(Delegation.objects.filter(Q(delegator_id=user.pk) | Q(delegate_id=user.pk))
                .select_related("delegator", "delegate", "created_by").order_by("-starts_at", "-id")[:100])


@router.post("/delegations", response={201: DelegationOut, **COMMON_ERRORS, **errors(403, 409)},
             summary="Name a stand-in for a period")
def delegations_create(request, payload: DelegationIn):
    """From `starts_at` to `ends_at` the delegate may decide what the caller may decide, in both
    names — never in their own session, never twice in one quorum. Needs approvals_app.decide_approval
    (a superuser may set one for anyone). 409 when the run-time refuses it (`invalid_delegation`: an
    unknown or inactive delegate, oneself, a period that is over, upside down or over 90 days) or it
    overlaps another of the delegator's (`delegation_overlaps`)."""
    if payload.delegator and payload.delegator != request.auth.get_username() and not request.auth.is_superuser:
        raise WardenError(ApprovalRefusal.NOT_PERMITTED, "Only a superuser may set someone else's delegation.")
    delegator = _person(payload.delegator, field="delegator") if payload.delegator else request.auth
    delegation_manager_check(delegator=delegator, acting_user=request.auth)  # before saying who exists
    return Status(201, delegation_set(delegator=delegator, delegate=_person(payload.delegate, field="delegate"),
                                      starts_at=payload.starts_at, ends_at=payload.ends_at, reason=payload.reason,
                                      acting_user=request.auth))


@router.post("/delegations/{delegation_id}/revoke", response={200: DelegationOut, **COMMON_ERRORS, **errors(403, 409)},
             summary="Revoke a delegation")
def delegations_revoke(request, delegation_id: int):
    """The stand-in's power ends now; what they decided stays decided."""
    user = request.auth
    delegation = Delegation.objects.filter(pk=delegation_id).select_related("delegator", "delegate", "created_by").first()
    if delegation is None or not (user.is_superuser or user.pk in (delegation.delegator_id, delegation.delegate_id)):
        raise not_found("delegation")
    return delegation_revoke(delegation=delegation, acting_user=user)
