"""GET /me: the caller, and the operator permissions that widen what the API shows them."""

from ninja import Router, Schema

from access import policy as access
from api.base import errors

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
