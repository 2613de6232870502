"""Freezes over HTTP (SPEC §18): the freezes in force, setting one on an agent, a tool or a
customer, and lifting it — through engine.actions.freezes, like the desk's; audited. Needs the
approvals_app.freeze_money permission; without it, 403."""

from datetime import datetime

from ninja import Field, Router, Schema, Status

from access import policy as access
from api.base import COMMON_ERRORS, BodyIn, StorableText, errors
from api.errors import not_found
from approvals_app.models import Freeze, FreezeMode, FreezeScope
from approvals_app.selectors import freezes_in_force
from config.errors import CommonRefusal, WardenError
from engine.actions.freezes import freeze_lift, freeze_set

router = Router(tags=["freezes"])


class FreezeOut(Schema):
    id: int
    scope: FreezeScope
    target: str = Field(description="the agent's slug, the tool's name or the customer's username")
    mode: FreezeMode = Field(description="`wait`: the scope's writes wait until it is lifted; `refuse`: they fail")
    reason: str
    created_by: str
    created_at: datetime
    lifted_by: str | None
    lifted_at: datetime | None

    @staticmethod
    def resolve_created_by(freeze) -> str:
        return freeze.created_by.get_username()

    @staticmethod
    def resolve_lifted_by(freeze) -> str | None:
        return freeze.lifted_by.get_username() if freeze.lifted_by_id else None


class FreezeIn(BodyIn):
    scope: str = Field(description="agent, tool or customer")
    target: StorableText = Field(max_length=150)
    mode: str = Field("wait", description="wait (default) or refuse")
    reason: StorableText = Field(min_length=1, max_length=1000, description="why; kept in the audit trail")


class LiftIn(BodyIn):
    note: StorableText = Field("", max_length=1000)


def _may_freeze(request) -> None:
    if not access.can_freeze(user=request.auth):
        raise WardenError(CommonRefusal.NOT_PERMITTED, "Freezes need the approvals_app.freeze_money permission.")


@router.get("", response={200: list[FreezeOut], **COMMON_ERRORS, **errors(403)}, summary="Freezes in force")
def freezes_list(request):
    _may_freeze(request)
    return freezes_in_force()


@router.post("", response={201: FreezeOut, **COMMON_ERRORS, **errors(403, 409)}, summary="Freeze money movement")
def freezes_create(request, payload: FreezeIn):
    """From the commit on, no write of the scope starts: it waits (`waiting / frozen`) or fails,
    as `mode` says. Reads and conversations go on."""
    _may_freeze(request)
    return Status(201, freeze_set(scope=payload.scope, target=payload.target, mode=payload.mode,
                                  reason=payload.reason, acting_user=request.auth))


@router.post("/{freeze_id}/lift", response={200: FreezeOut, **COMMON_ERRORS, **errors(403, 409)}, summary="Lift a freeze")
def freezes_lift(request, freeze_id: int, payload: LiftIn | None = None):
    """The runs it held resume (each write then starts once)."""
    _may_freeze(request)
    freeze = Freeze.objects.filter(pk=freeze_id).first()
    if freeze is None:
        raise not_found("freeze")
    return freeze_lift(freeze=freeze, acting_user=request.auth, note=payload.note if payload else "")
