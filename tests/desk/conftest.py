"""The operators' desk scenes: a refund waiting for approval and a refund whose outcome is
unknown, built the way the engine leaves them, and staff users with and without permissions."""

import pytest

from runs_app.models import WaitReason
from tests.support.desk import RefundScene, refund_scene, staff_user
from tests.support.factories import ApprovalFactory, UserFactory
from tools_app.models import ToolCallStatus



@pytest.fixture
def viewer(db):
    """Staff who may look at the desk but decide, reconcile and cancel nothing."""
    return staff_user("viewer")


@pytest.fixture
def reconciler(db):
    return staff_user("reconciler", "reconcile_toolcall")


@pytest.fixture
def canceller(db):
    return staff_user("canceller", "change_run")


@pytest.fixture
def customer(db):
    return UserFactory(username="alice")


@pytest.fixture
def pending_refund(customer) -> RefundScene:
    scene = refund_scene(owner=customer, wait_reason=WaitReason.APPROVAL, refund_status=ToolCallStatus.PENDING)
    scene.approval = ApprovalFactory(tool_call=scene.refund, run=scene.run)
    return scene


@pytest.fixture
def unknown_refund(customer) -> RefundScene:
    return refund_scene(owner=customer, wait_reason=WaitReason.RECONCILIATION, refund_status=ToolCallStatus.UNKNOWN)


@pytest.fixture
def make_unknown_refund(customer):
    return lambda: refund_scene(owner=customer, wait_reason=WaitReason.RECONCILIATION, refund_status=ToolCallStatus.UNKNOWN)


@pytest.fixture
def own_unknown_refund(reconciler) -> RefundScene:
    """A write in doubt in the reconciler's own session: four eyes bars them from settling it."""
    return refund_scene(owner=reconciler, wait_reason=WaitReason.RECONCILIATION, refund_status=ToolCallStatus.UNKNOWN)
