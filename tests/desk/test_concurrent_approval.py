"""A decision is recorded exactly once even when many operators click at the same moment
(SPEC §7): one winner, everybody else told who decided, one audit entry, one resume."""

import threading

import pytest
from django.db import connection

from approvals_app.models import ApprovalStatus, AuditEntry
from approvals_app.errors import ApprovalRefusal
from config.errors import WardenError
from engine.actions.approvals import approval_decide
from runs_app.models import RunEvent
from tests.support.desk import staff_user

pytestmark = pytest.mark.django_db(transaction=True)

CLICKS = 8


def test_concurrent_approval_clicks_record_exactly_one_decision(pending_refund):
    operators = [staff_user(f"op{i}", "decide_approval") for i in range(CLICKS)]
    barrier = threading.Barrier(CLICKS)
    outcomes: dict[str, str] = {}

    def click(operator):
        try:
            barrier.wait()
            approval_decide(approval=pending_refund.approval, decision="approve", note=f"by {operator.username}", acting_user=operator)
            outcomes[operator.username] = "won"
        except WardenError as error:
            assert error.code is ApprovalRefusal.ALREADY_DECIDED
            outcomes[operator.username] = error.message
        finally:
            connection.close()

    threads = [threading.Thread(target=click, args=(operator,)) for operator in operators]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    winners = [name for name, outcome in outcomes.items() if outcome == "won"]
    assert len(outcomes) == CLICKS and len(winners) == 1, outcomes
    approval = pending_refund.approval
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and approval.decided_by.username == winners[0]
    assert approval.note == f"by {winners[0]}"
    for name, outcome in outcomes.items():
        if name != winners[0]:
            assert outcome.startswith(f"Already approved by {winners[0]} at "), outcome
    assert AuditEntry.objects.filter(object_id=str(approval.pk)).count() == 1
    events = RunEvent.objects.filter(run=pending_refund.run)
    assert events.filter(type="approval_decided").count() == 1
    assert events.filter(type="run_status", payload__resumed_from="approval").count() == 1
