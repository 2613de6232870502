"""GET /api/v1/ledger (docs/LEDGER.md): the tamper-evident ledger of a time range, streamed as JSON
lines or CSV for a SIEM — to those the access policy lets export it (approvals_app.export_ledger),
403 JSON for everyone else, 422 JSON for a range it cannot read."""

import asyncio
import csv
import io
import json
import time

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from api.ledger import _export_async
from approvals_app.ledger import LedgerKind, ledger_append
from approvals_app.models import LedgerEntry
from tests.support.api import Api, grant
from tests.support.factories import ApiKeyFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def auditor_api(db):
    return Api(ApiKeyFactory(owner=grant(UserFactory(username="auditor"), ("approvals_app", "export_ledger"))).secret)


@pytest.fixture
def entries(db) -> list[LedgerEntry]:
    actor = UserFactory(username="on-call")
    for i in range(5):
        ledger_append(kind=LedgerKind.FREEZE_SET, actor=actor, subject=f"freeze:{i}", payload={"i": i})
        time.sleep(0.002)
    return list(LedgerEntry.objects.order_by("seq"))


def body(response) -> str:
    assert response.streaming, response.content
    return b"".join(response.streaming_content).decode()


def test_json_lines_of_a_time_range(auditor_api, entries):
    response = auditor_api.get("/ledger", {"from": entries[1].created_at.isoformat(), "to": entries[3].created_at.isoformat()})
    assert response.status_code == 200 and response["Content-Type"].startswith("application/x-ndjson")
    records = [json.loads(line) for line in body(response).splitlines()]
    assert [(r["seq"], r["prev_hash"], r["hash"]) for r in records] == [(e.seq, e.prev_hash, e.hash) for e in entries[1:3]]
    assert records[0] | {"payload": None} == {
        "seq": 2, "created_at": records[0]["created_at"], "kind": "freeze_set", "actor": "on-call",
        "actor_id": entries[1].actor_id, "subject": "freeze:1", "payload": None, "prev_hash": entries[0].hash,
        "hash": entries[1].hash}
    assert records[0]["payload"] == {"i": 1}


def test_csv_of_everything(auditor_api, entries):
    response = auditor_api.get("/ledger", {"format": "csv"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(body(response))))
    assert [int(row["seq"]) for row in rows] == [1, 2, 3, 4, 5]
    assert [row["hash"] for row in rows] == [e.hash for e in entries]


def test_without_the_permission_the_answer_is_403(entries):
    operator = grant(UserFactory(username="approver", is_staff=True), ("approvals_app", "decide_approval"),
                     ("runs_app", "view_run"))
    for caller in (UserFactory(username="customer"), operator):
        response = Api(ApiKeyFactory(owner=caller).secret).get("/ledger")
        assert response.status_code == 403 and response.json()["code"] == "not_permitted", response.content
    assert Api().get("/ledger").status_code == 401


@pytest.mark.parametrize("params, field", [
    ({"from": "yesterday"}, "query.from"),
    ({"to": "2026-13-45T00:00:00Z"}, "query.to"),
    ({"from": "2026-12-02T00:00:00Z", "to": "2026-12-01T00:00:00Z"}, "query.to"),
    ({"format": "xml"}, "query.format"),
    ({"since": "2026-12-01T00:00:00Z"}, "query.since"),
])
def test_a_range_or_format_it_cannot_read_is_422(auditor_api, params, field):
    response = auditor_api.get("/ledger", params)
    assert response.status_code == 422, response.content
    assert field in [f["field"] for f in response.json()["fields"]], response.json()


@pytest.mark.django_db(transaction=True)
def test_under_asgi_the_export_streams_a_page_at_a_time(entries, monkeypatch):
    monkeypatch.setattr("api.ledger.PAGE_SIZE", 2)

    async def collect() -> str:
        try:
            return "".join([chunk async for chunk in _export_async(since=None, until=None, fmt="jsonl")])
        finally:
            await sync_to_async(connections.close_all)()  # the pages' thread's own connection

    lines = asyncio.run(collect()).splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [1, 2, 3, 4, 5]
