"""The overview on the admin index: what waits for an operator, and the state of all runs."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from approvals_app.models import Approval, ApprovalStatus
from approvals_app.selectors import desk_overview
from runs_app.models import RunStatus, WaitReason
from tests.support.desk import csrf_client
from tests.support.factories import ApprovalFactory, RunFactory
from tools_app.models import ToolCall

pytestmark = pytest.mark.django_db


def _number(body: str, element_id: str) -> int:
    match = re.search(rf'id="{element_id}">\s*<span class="desk-number">(\d+)</span>', body)
    assert match, element_id
    return int(match.group(1))


def _cell(body: str, attribute: str, value: str) -> int:
    match = re.search(rf'{attribute}="{value}">(\d+)</a>', body)
    assert match, (attribute, value)
    return int(match.group(1))


@pytest.fixture
def desk_world(pending_refund, make_unknown_refund):
    """Two pending approvals, one decided; two unknown refunds; runs in several states."""
    older_approval = ApprovalFactory()
    Approval.objects.filter(pk=older_approval.pk).update(requested_at=timezone.now() - timedelta(hours=2))
    decided = ApprovalFactory()
    Approval.objects.filter(pk=decided.pk).update(status=ApprovalStatus.EXPIRED, decided_at=timezone.now())
    first_unknown, _second_unknown = make_unknown_refund(), make_unknown_refund()
    # The oldest thing waiting for a human: an unknown call, unknown for three hours.
    ToolCall.objects.filter(pk=first_unknown.refund.pk).update(finished_at=timezone.now() - timedelta(hours=3))
    RunFactory(status=RunStatus.COMPLETED, phase="", finished_at=timezone.now())
    RunFactory(status=RunStatus.WAITING, phase="", wait_reason=WaitReason.WAITING_INPUT)
    return {"oldest": first_unknown.refund}


def test_overview_counts(desk_world):
    overview = desk_overview()
    assert overview.pending_approvals == 2
    assert overview.unknown_calls == 2
    # Runs: the approval scene, 2 reconciliation scenes, the factory runs behind the two other
    # approvals (queued), one completed, one waiting for input.
    assert overview.runs_by_status == {
        "queued": 2, "running": 0, "waiting": 4, "completed": 1, "failed": 0, "cancelled": 0,
    }
    assert overview.runs_by_wait_reason == {"waiting_input": 1, "approval": 1, "retry_backoff": 0, "reconciliation": 2,
                                            "frozen": 0}
    assert overview.oldest_waiting.kind == "unknown tool call" and overview.oldest_waiting.pk == desk_world["oldest"].pk


def test_admin_index_shows_the_overview_with_links(viewer, desk_world):
    body = csrf_client(viewer).get(reverse("admin:index")).content.decode()
    assert _number(body, "overview-pending-approvals") == 2
    assert _number(body, "overview-unknown-calls") == 2
    assert reverse("admin:approvals_app_approval_changelist") + "?status__exact=pending" in body
    assert reverse("admin:tools_app_unknowntoolcall_changelist") in body
    assert _cell(body, "data-status", "waiting") == 4 and _cell(body, "data-status", "queued") == 2
    assert _cell(body, "data-wait-reason", "reconciliation") == 2 and _cell(body, "data-wait-reason", "approval") == 1
    oldest = re.search(r'id="overview-oldest">(.*?)</div>', body, re.S).group(1)
    assert reverse("admin:tools_app_unknowntoolcall_change", args=[desk_world["oldest"].pk]) in oldest
    assert "3 h 00 m" in oldest  # how long, not "0 minutes" or "3 hours"


def test_overview_with_nothing_waiting(viewer):
    body = csrf_client(viewer).get(reverse("admin:index")).content.decode()
    assert _number(body, "overview-pending-approvals") == 0
    assert "Oldest waiting:<br>" in body and "nothing" in body
