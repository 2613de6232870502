"""Out-of-office delegations (issue 31, point 3): a decider names a stand-in for a period; the
stand-in decides in both names (engine.actions.approvals.approval_decide records them) and never
in their own session or twice in one quorum (access.policy). Setting and revoking are one
transaction each, audited and on the ledger, because a stand-in's decision is only as good as the
delegation it was made under."""

from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from access import policy as access
from approvals_app.errors import ApprovalRefusal
from approvals_app.ledger import ledger_delegation
from approvals_app.models import Delegation
from approvals_app.services import audit_record
from config.errors import WardenError

# A delegation is for an absence, not a standing grant of someone's powers.
DELEGATION_MAX_DAYS = 90
DELEGATION_REASON_CHARS = Delegation._meta.get_field("reason").max_length


def delegation_set(*, delegator, delegate, starts_at: datetime | None, ends_at: datetime, reason: str,
                   acting_user) -> Delegation:
    """From `starts_at` (now when None) to `ends_at`, `delegate` may decide what `delegator` may.
    One's own, by anyone who may decide operator approvals; anyone's, by a superuser. Refused, with
    nothing written, when it would overlap another of the delegator's delegations not yet ended."""
    reason = " ".join((reason or "").split())
    starts_at = starts_at or timezone.now()
    delegation_manager_check(delegator=delegator, acting_user=acting_user)
    _check(delegator=delegator, delegate=delegate, starts_at=starts_at, ends_at=ends_at, reason=reason)
    with transaction.atomic():
        # The delegator's row, so two overlapping delegations set at once cannot both pass the check.
        get_user_model().objects.select_for_update(no_key=True).filter(pk=delegator.pk).first()
        overlapping = (Delegation.objects.filter(delegator_id=delegator.pk, revoked_at__isnull=True,
                                                 starts_at__lt=ends_at, ends_at__gt=max(starts_at, timezone.now()))
                       .select_related("delegate").order_by("starts_at").first())
        if overlapping is not None:
            raise WardenError(ApprovalRefusal.DELEGATION_OVERLAPS,
                              f"{delegator.get_username()} already has {overlapping.delegate.get_username()} standing in "
                              f"from {_day(overlapping.starts_at)} to {_day(overlapping.ends_at)}: revoke that delegation "
                              "first, or choose a period that does not overlap it.")
        delegation = Delegation.objects.create(delegator=delegator, delegate=delegate, starts_at=starts_at, ends_at=ends_at,
                                               reason=reason, created_by=acting_user)
        audit_record(actor=acting_user, action="delegate", obj=delegation, before={}, after={
            "delegator": delegator.get_username(), "delegate": delegate.get_username(),
            "starts_at": starts_at.isoformat(), "ends_at": ends_at.isoformat()}, note=reason)
        ledger_delegation(delegation=delegation, acting_user=acting_user, revoked=False)
    return delegation


def delegation_revoke(*, delegation: Delegation, acting_user) -> Delegation:
    """The stand-in's power ends now; what they decided before stays decided, in both names."""
    delegation_manager_check(delegator=delegation.delegator, acting_user=acting_user)
    with transaction.atomic():
        revoked = Delegation.objects.filter(pk=delegation.pk, revoked_at__isnull=True, ends_at__gt=timezone.now()).update(
            revoked_at=timezone.now())
        if not revoked:
            delegation.refresh_from_db()
            state = f"revoked at {_day(delegation.revoked_at)}" if delegation.revoked_at else f"ended at {_day(delegation.ends_at)}"
            raise WardenError(ApprovalRefusal.DELEGATION_ENDED, f"This delegation was {state} already: nothing to revoke.")
        delegation.refresh_from_db()
        audit_record(actor=acting_user, action="revoke_delegation", obj=delegation,
                     before={"revoked_at": None}, after={"revoked_at": delegation.revoked_at.isoformat()})
        ledger_delegation(delegation=delegation, acting_user=acting_user, revoked=True)
    return delegation


def delegation_manager_check(*, delegator, acting_user) -> None:
    """Refused (NOT_PERMITTED) unless `acting_user` may set and revoke `delegator`'s delegations:
    their own, with the permission to decide operator approvals; anyone's, as a superuser."""
    if not access.is_active(acting_user):
        raise WardenError(ApprovalRefusal.NOT_PERMITTED, "Sign in with an active account to manage delegations.")
    if acting_user.is_superuser:
        return
    if acting_user.pk != delegator.pk:
        raise WardenError(ApprovalRefusal.NOT_PERMITTED,
                          f"Only {delegator.get_username()} or a superuser may manage {delegator.get_username()}'s delegations.")
    if not access.operator_powers(acting_user)["decide_operator_approvals"]:
        raise WardenError(ApprovalRefusal.NOT_PERMITTED,
                          "Only someone who may decide operator approvals (approvals_app.decide_approval) may name a stand-in.")


def _check(*, delegator, delegate, starts_at: datetime, ends_at: datetime, reason: str) -> None:
    fields = {}
    if delegate is None:
        fields["delegate"] = "who stands in: a user's username"
    elif delegate.pk == delegator.pk:
        fields["delegate"] = "someone else: a delegation to oneself gives nothing"
    elif not delegate.is_active:
        fields["delegate"] = f"{delegate.get_username()}'s account is inactive"
    if not delegator.is_active:
        fields["delegator"] = f"{delegator.get_username()}'s account is inactive"
    elif not access.operator_powers(delegator)["decide_operator_approvals"]:
        fields["delegator"] = (f"{delegator.get_username()} may not decide operator approvals, so there is nothing "
                               "to delegate")
    if ends_at <= starts_at:
        fields["ends_at"] = "after the start"
    elif ends_at <= timezone.now():
        fields["ends_at"] = "in the future: this period is over already"
    elif ends_at - starts_at > timedelta(days=DELEGATION_MAX_DAYS):
        fields["ends_at"] = f"at most {DELEGATION_MAX_DAYS} days after the start"
    if len(reason) > DELEGATION_REASON_CHARS:
        fields["reason"] = f"at most {DELEGATION_REASON_CHARS} characters"
    if fields:
        raise WardenError(ApprovalRefusal.INVALID_DELEGATION, "The delegation was refused, nothing was set: "
                          + "; ".join(f"{field}: {message}" for field, message in fields.items()),
                          fields=[{"field": f"body.{field}", "message": message, "type": ApprovalRefusal.INVALID_DELEGATION.value}
                                  for field, message in fields.items()])


def _day(moment) -> str:
    return timezone.localtime(moment).strftime("%d %b %Y %H:%M %Z")
