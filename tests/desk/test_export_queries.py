"""A desk list's CSV export reads its columns with its rows: exporting fifteen rows costs the same
queries as exporting three (desk/export.py streams `changelist.queryset`; a column that reached for
a related object row by row would cost one query per row)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from runs_app.models import WaitReason
from tests.support.desk import csrf_client, refund_scene
from tests.support.factories import ApprovalFactory, AuditEntryFactory, LedgerEntryFactory, UserFactory
from tools_app.models import ToolCallStatus

pytestmark = pytest.mark.django_db

EXPORTS = ["runs_app_run", "tools_app_toolcall", "approvals_app_approval", "approvals_app_auditentry",
           "approvals_app_ledgerentry"]


def _more_rows(count: int) -> None:
    """`count` of every exported kind: a refund waiting for approval (a run, two tool calls, an
    approval), an audit entry and a ledger entry."""
    for _ in range(count):
        scene = refund_scene(owner=UserFactory(), wait_reason=WaitReason.APPROVAL, refund_status=ToolCallStatus.PENDING)
        ApprovalFactory(tool_call=scene.refund, run=scene.run)
        AuditEntryFactory(run_id=scene.run.pk)
        LedgerEntryFactory()


def _export(client, name: str) -> tuple[int, int]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse(f"admin:{name}_export_csv"))
        lines = b"".join(response.streaming_content).decode().splitlines()
    assert response.status_code == 200
    return len(lines) - 1, len(queries)


@pytest.mark.parametrize("name", EXPORTS)
def test_an_export_costs_the_same_queries_for_fifteen_rows_as_for_three(name):
    client = csrf_client(UserFactory(username="boss", is_staff=True, is_superuser=True))
    _more_rows(3)
    few_rows, few_queries = _export(client, name)
    _more_rows(12)
    many_rows, many_queries = _export(client, name)
    assert many_rows > few_rows >= 3
    assert many_queries == few_queries, f"{many_queries - few_queries} more queries for {many_rows - few_rows} more rows"
