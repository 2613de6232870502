"""Freezing money movement (SPEC §18): an operator with approvals_app.freeze_money stops an
agent's, a tool's or a customer's writes at once — from the commit on, no write of the scope
starts (engine.tool_exec waits the run as `waiting / frozen`, or refuses the call, as the freeze
says) — and lifts the freeze, which resumes the runs it held. Reads and conversations go on. Both
are audited, naming who and why."""

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from access import policy as access
from agents.models import Agent
from approvals_app.errors import ApprovalRefusal
from approvals_app.ledger import ledger_freeze
from approvals_app.models import Freeze, FreezeMode, FreezeScope
from approvals_app.services import audit_record
from config.errors import WardenError
from engine.actions.runs import run_resume
from engine.state import freeze_gate
from runs_app.models import Run, RunStatus, WaitReason
from tools_app.models import ToolEffect
from tools_app.registry import tool_get


def freeze_set(*, scope: str, target: str, reason: str, acting_user, mode: str = FreezeMode.WAIT) -> Freeze:
    if not access.can_freeze(user=acting_user):
        raise WardenError(ApprovalRefusal.NOT_PERMITTED, "Freezing money movement needs the approvals_app.freeze_money permission.")
    target, reason = (target or "").strip(), " ".join((reason or "").split())
    _check(scope=scope, target=target, reason=reason, mode=mode)
    try:
        with transaction.atomic():
            freeze_gate(setting=True)
            freeze = Freeze.objects.create(scope=scope, target=target, mode=mode, reason=reason, created_by=acting_user)
            audit_record(actor=acting_user, action="freeze", obj=freeze, before={},
                         after={"scope": scope, "target": target, "mode": mode}, note=reason)
            ledger_freeze(freeze=freeze, acting_user=acting_user, lifted=False)
    except IntegrityError:
        raise WardenError(ApprovalRefusal.FREEZE_EXISTS, f"The {scope} {target!r} is frozen already.") from None
    return freeze


def freeze_lift(*, freeze: Freeze, acting_user, note: str = "") -> Freeze:
    """Lift the freeze and resume every run it held (a run another freeze still holds waits again)."""
    if not access.can_freeze(user=acting_user):
        raise WardenError(ApprovalRefusal.NOT_PERMITTED, "Unfreezing needs the approvals_app.freeze_money permission.")
    with transaction.atomic():
        lifted = Freeze.objects.filter(pk=freeze.pk, lifted_at__isnull=True).update(
            lifted_at=timezone.now(), lifted_by=acting_user, lift_note=note)
        if not lifted:
            raise WardenError(ApprovalRefusal.FREEZE_LIFTED, "This freeze was lifted already.")
        freeze.refresh_from_db()
        audit_record(actor=acting_user, action="unfreeze", obj=freeze, before={"scope": freeze.scope, "target": freeze.target},
                     after={"lifted": True}, note=note)
        ledger_freeze(freeze=freeze, acting_user=acting_user, lifted=True)
        held = list(Run.objects.filter(status=RunStatus.WAITING, wait_reason=WaitReason.FROZEN).values_list("pk", flat=True))
    for run_id in held:
        run_resume(run_id=run_id, wait_reasons=[WaitReason.FROZEN], event_payload={"freeze": freeze.pk, "lifted": True})
    return freeze


def _check(*, scope: str, target: str, reason: str, mode: str) -> None:
    fields = {}
    if scope not in FreezeScope.values:
        fields["scope"] = f"one of {', '.join(FreezeScope.values)}"
    elif not target:
        fields["target"] = "what to freeze: an agent's slug, a tool's name or a customer's username"
    elif scope == FreezeScope.AGENT and not Agent.objects.filter(slug=target).exists():
        fields["target"] = f"no agent {target!r}"
    elif scope == FreezeScope.TOOL and (tool_get(target) is None or tool_get(target).effect != ToolEffect.WRITE):
        fields["target"] = f"no write tool {target!r}"
    elif scope == FreezeScope.CUSTOMER and not get_user_model().objects.filter(username=target).exists():
        fields["target"] = f"no customer {target!r}"
    if mode not in FreezeMode.values:
        fields["mode"] = f"one of {', '.join(FreezeMode.values)}"
    if not reason:
        fields["reason"] = "why: it is kept in the audit trail"
    if fields:
        raise WardenError(ApprovalRefusal.INVALID_FREEZE, "The freeze was refused, nothing was set: "
                          + "; ".join(f"{field}: {message}" for field, message in fields.items()),
                          fields=[{"field": f"body.{field}", "message": message, "type": ApprovalRefusal.INVALID_FREEZE.value}
                                  for field, message in fields.items()])
