"""The tamper-evident ledger (issue 31, docs/LEDGER.md): every human decision about money and every
outcome of a write is appended, in the transaction that makes it, to a hash chain; `verify_ledger`
walks it and names the first entry that was altered, re-linked or removed behind Warden's back; the
chain stays one line under concurrent appends; `export_ledger` writes a time range as JSON lines or
CSV that a SIEM can verify on its own."""

import csv
import hashlib
import io
import json
import threading
import time

import psycopg
import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from approvals_app.ledger import (
    GENESIS_HASH,
    LedgerKind,
    canonical_json,
    entry_body,
    entry_hash,
    ledger_append,
    ledger_verify,
)
from approvals_app.models import Approval, ApprovalStatus, Freeze, LedgerEntry
from engine.actions.approvals import approval_decide
from engine.actions.freezes import freeze_lift, freeze_set
from engine.actions.reconciliation import tool_call_resolve
from engine.state import tool_call_transition
from runs_app.models import RunStatus, WaitReason
from tests.support.api import Api, build_world, grant
from tests.support.drive import drive_until
from tests.support.factories import ApiKeyFactory, LedgerEntryFactory, StepFactory, ToolCallFactory, UserFactory
from tests.support.processes import test_database_url as database_url_of_the_tests
from tests.support.processes import wait_for
from tools_app.models import ToolCall, ToolCallStatus
from tools_app.services import tool_call_digest

pytestmark = pytest.mark.django_db(transaction=True)


def kinds() -> list[tuple[str, str]]:
    return list(LedgerEntry.objects.order_by("seq").values_list("kind", "actor"))


def payload(entry: LedgerEntry) -> dict:
    return json.loads(entry.payload)


def verify() -> tuple[int, str]:
    """verify_ledger's exit status and what it said."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("verify_ledger", stdout=out, stderr=err)
    except SystemExit as exit_:
        return exit_.code, err.getvalue()
    return 0, out.getvalue()


def tamper(sql: str, params=()) -> None:
    """A database administrator's direct edit: the append-only trigger switched off around it."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("ALTER TABLE approvals_app_ledgerentry DISABLE TRIGGER ledger_entry_append_only")
        cursor.execute(sql, params)
        cursor.execute("ALTER TABLE approvals_app_ledgerentry ENABLE TRIGGER ledger_entry_append_only")


@pytest.fixture
def operator_user(transactional_db):
    return grant(UserFactory(username="ledger-operator", is_staff=True), ("approvals_app", "decide_approval"),
                 ("runs_app", "view_run"), ("approvals_app", "freeze_money"), ("tools_app", "reconcile_toolcall"))


# --- what goes on the ledger -------------------------------------------------------------------------

@pytest.mark.usefixtures("simulator", "demo_world")
def test_an_approval_through_the_api_and_the_refund_it_lets_through_are_chained(operator_user):
    customer = Api(ApiKeyFactory(owner=UserFactory(username="ledger-customer")).secret)
    session = customer.post("/sessions", {"title": "refund"}).json()
    run_id = customer.post(f"/sessions/{session['id']}/messages", {"content": "Please refund order 9527"}).json()["run"]["id"]
    drive_until(run_id, RunStatus.WAITING, WaitReason.APPROVAL)
    approval = Approval.objects.select_related("tool_call").get(run_id=run_id)
    assert not LedgerEntry.objects.exists()  # a request is no decision

    desk = Api(ApiKeyFactory(owner=operator_user).secret)
    assert desk.post(f"/approvals/{approval.pk}/decision", {"decision": "approve", "note": "ok"}).status_code == 200
    drive_until(run_id, RunStatus.COMPLETED)

    decided, outcome = LedgerEntry.objects.order_by("seq")
    assert (decided.seq, decided.kind, decided.actor, decided.actor_id) == (1, LedgerKind.APPROVAL_APPROVE,
                                                                            "ledger-operator", operator_user.pk)
    assert decided.subject == f"approval:{approval.pk}" and decided.prev_hash == GENESIS_HASH
    assert payload(decided)["note"] == "ok" and payload(decided)["decision"] == "approve"
    assert (payload(decided)["status"], payload(decided)["digest"]) == (ApprovalStatus.APPROVED, approval.digest)
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert (outcome.seq, outcome.kind, outcome.actor, outcome.subject) == (2, LedgerKind.WRITE_OUTCOME, "system",
                                                                           f"tool_call:{call.pk}")
    assert outcome.prev_hash == decided.hash
    assert {k: payload(outcome)[k] for k in ("from", "status", "idempotency_key", "digest")} == {
        "from": ToolCallStatus.RUNNING, "status": ToolCallStatus.SUCCEEDED, "idempotency_key": call.idempotency_key,
        "digest": tool_call_digest(call)}
    # Reads move no money: the run's lookups left nothing on the ledger.
    assert ToolCall.objects.filter(run_id=run_id, effect="read").exists() and LedgerEntry.objects.count() == 2
    assert verify() == (0, f"ledger OK: 2 entries, last #2 {outcome.hash}\n")


@pytest.mark.usefixtures("simulator", "demo_world")
def test_an_edit_records_both_digests(operator_user):
    customer = Api(ApiKeyFactory(owner=UserFactory(username="edit-customer")).secret)
    session = customer.post("/sessions", {"title": "refund"}).json()
    run_id = customer.post(f"/sessions/{session['id']}/messages", {"content": "Please refund order 9527"}).json()["run"]["id"]
    drive_until(run_id, RunStatus.WAITING, WaitReason.APPROVAL)
    approval = Approval.objects.select_related("tool_call").get(run_id=run_id)
    before = approval.digest
    editor = grant(UserFactory(username="ledger-editor", is_staff=True), ("approvals_app", "decide_approval"))
    edited = {**approval.tool_call.arguments, "amount": "1.00"}
    response = Api(ApiKeyFactory(owner=editor).secret).post(f"/approvals/{approval.pk}/edit",
                                                           {"arguments": edited, "reason": "only the shipping"})
    assert response.status_code == 200, response.content
    (entry,) = LedgerEntry.objects.all()
    approval.refresh_from_db()
    assert (entry.kind, entry.actor) == (LedgerKind.APPROVAL_EDIT, "ledger-editor")
    assert (payload(entry)["digest_before"], payload(entry)["digest_after"]) == (before, approval.digest)
    assert before != approval.digest and payload(entry)["reason"] == "only the shipping"


def test_a_rejection_and_the_cancelled_write_it_leaves(operator_user):
    world = build_world(UserFactory(username="reject-customer"))
    approval_decide(approval=world.operator_approval, decision="reject", note="not eligible", acting_user=operator_user)
    assert kinds() == [(LedgerKind.APPROVAL_REJECT, "ledger-operator"), (LedgerKind.WRITE_OUTCOME, "system")]
    rejected, cancelled = LedgerEntry.objects.order_by("seq")
    assert payload(rejected)["status"] == ApprovalStatus.REJECTED and payload(rejected)["note"] == "not eligible"
    assert (payload(cancelled)["from"], payload(cancelled)["status"]) == (ToolCallStatus.PENDING, ToolCallStatus.CANCELLED)


def test_a_quorum_puts_each_approval_on_the_ledger(operator_user):
    world = build_world(UserFactory(username="quorum-customer"))
    Approval.objects.filter(pk=world.operator_approval.pk).update(required_approvals=2)
    second = grant(UserFactory(username="second-operator", is_staff=True), ("approvals_app", "decide_approval"))
    approval_decide(approval=world.operator_approval, decision="approve", acting_user=operator_user)
    approval_decide(approval=world.operator_approval, decision="approve", acting_user=second)
    first, last = LedgerEntry.objects.order_by("seq")
    assert (payload(first)["status"], payload(first)["approved_by"]) == (ApprovalStatus.PENDING, ["ledger-operator"])
    assert (last.actor, payload(last)["status"]) == ("second-operator", ApprovalStatus.APPROVED)
    assert payload(last)["approved_by"] == ["ledger-operator", "second-operator"]


def test_freezes_set_and_lifted(operator_user):
    freeze = freeze_set(scope="tool", target="execute_refund", reason="INC-7", acting_user=operator_user)
    freeze_lift(freeze=freeze, acting_user=operator_user, note="INC-7 closed")
    assert kinds() == [(LedgerKind.FREEZE_SET, "ledger-operator"), (LedgerKind.FREEZE_LIFT, "ledger-operator")]
    set_, lift = LedgerEntry.objects.order_by("seq")
    assert payload(set_) == {"freeze": freeze.pk, "scope": "tool", "target": "execute_refund", "mode": "wait",
                             "reason": "INC-7"}
    assert payload(lift)["note"] == "INC-7 closed" and lift.subject == f"freeze:{freeze.pk}"


def test_reconciliations_by_an_operator_and_by_the_sweeper(operator_user):
    first, second = (build_world(UserFactory(username=f"unknown-{n}")).unknown_call for n in range(2))
    tool_call_resolve(tool_call=first, applied=True, evidence="gateway statement line 12", acting_user=operator_user)
    tool_call_resolve(tool_call=second, applied=False, evidence="no such request by key", acting_user=None)
    by_operator, by_sweeper = LedgerEntry.objects.order_by("seq")
    assert (by_operator.kind, by_operator.actor, by_sweeper.kind, by_sweeper.actor) == (
        LedgerKind.WRITE_RECONCILED, "ledger-operator", LedgerKind.WRITE_RECONCILED, "system")
    assert {k: payload(by_operator)[k] for k in ("from", "status", "resolution", "evidence")} == {
        "from": ToolCallStatus.UNKNOWN, "status": ToolCallStatus.SUCCEEDED, "resolution": "applied",
        "evidence": "gateway statement line 12"}
    assert payload(by_sweeper)["resolution"] == "not_applied"


def test_a_rolled_back_change_leaves_no_entry_and_no_gap(operator_user):
    with pytest.raises(RuntimeError), transaction.atomic():
        freeze_set(scope="tool", target="execute_refund", reason="undone", acting_user=operator_user)
        assert LedgerEntry.objects.count() == 1
        raise RuntimeError("the request failed after the freeze")
    assert not Freeze.objects.exists() and not LedgerEntry.objects.exists()
    freeze_set(scope="tool", target="execute_refund", reason="kept", acting_user=operator_user)
    assert list(LedgerEntry.objects.values_list("seq", flat=True)) == [1]


def test_the_database_refuses_to_change_or_remove_an_entry_even_on_the_erasure_path():
    entry = LedgerEntryFactory()
    for change in (lambda: LedgerEntry.objects.filter(pk=entry.pk).update(payload="{}"),
                   lambda: LedgerEntry.objects.filter(pk=entry.pk).delete()):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL warden.erasure = 'on'")  # what lets retention through elsewhere
            change()
    assert LedgerEntry.objects.get(pk=entry.pk).payload == entry.payload


# --- concurrency -------------------------------------------------------------------------------------

def test_concurrent_appends_make_one_unbroken_chain():
    """Eight threads, each on its own connection, append in transactions of their own (some rolled
    back): every committed entry is numbered once, in one line, gap-free."""
    actor = UserFactory(username="concurrent")
    errors, start = [], threading.Barrier(8)

    def appender(n: int) -> None:
        try:
            start.wait()
            for i in range(25):
                try:
                    with transaction.atomic():
                        ledger_append(kind=LedgerKind.FREEZE_SET, actor=actor, subject=f"thread:{n}", payload={"i": i})
                        if i % 5 == 4:
                            raise RuntimeError("rolled back")
                except RuntimeError:
                    pass
        except Exception as error:  # noqa: BLE001 - reported by the test
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=appender, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert list(LedgerEntry.objects.values_list("seq", flat=True)) == list(range(1, 8 * 20 + 1))
    assert ledger_verify().ok
    times = list(LedgerEntry.objects.values_list("created_at", flat=True))
    assert times == sorted(times)  # seq order is time order: a time range is a seq range


def test_a_workers_write_outcome_takes_the_sessions_lock_before_the_ledgers():
    """A decision holds the session's lock and then appends; a worker appending a write's outcome
    must not hold the ledger while it waits for that session (its commit writes the history next):
    it waits for the session first, holding nothing of the ledger."""
    world = build_world(UserFactory(username="lock-customer"))
    run = world.approval_run
    call = ToolCallFactory(run=run, step=StepFactory(run=run, index=1), tool_name="execute_refund", effect="write",
                           status=ToolCallStatus.RUNNING, idempotency_key="execute_refund:lock-order")
    url, outcome = database_url_of_the_tests(), {}

    def finish() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                outcome["pid"] = cursor.fetchone()[0]
            with transaction.atomic():
                tool_call_transition(tool_call=call, to=ToolCallStatus.SUCCEEDED, result={"refund_id": "r-9"})
            outcome["done"] = True
        except Exception as error:  # noqa: BLE001 - reported below
            outcome["error"] = error
        finally:
            connection.close()

    with psycopg.connect(url) as holder, psycopg.connect(url, autocommit=True) as observer:
        holder.execute('SELECT 1 FROM "sessions_app_session" WHERE "id" = %s FOR NO KEY UPDATE', [run.session_id])
        thread = threading.Thread(target=finish)
        thread.start()

        def blocked_by_holder() -> bool:
            if "pid" not in outcome:
                return False
            (blockers,) = observer.execute("SELECT pg_blocking_pids(%s)", [outcome["pid"]]).fetchone()
            return holder.info.backend_pid in blockers

        wait_for(lambda: not thread.is_alive() or blocked_by_holder(), message="the outcome to reach the session's lock")
        assert thread.is_alive(), outcome
        (free,) = observer.execute("SELECT pg_try_advisory_xact_lock(28, 0)").fetchone()
        assert free, "the ledger's lock is held while the session's is awaited"
        holder.rollback()
    thread.join()
    assert outcome.get("done"), outcome
    (entry,) = LedgerEntry.objects.all()
    assert (entry.kind, entry.subject) == (LedgerKind.WRITE_OUTCOME, f"tool_call:{call.pk}")


# --- verification ------------------------------------------------------------------------------------

def append_many(count: int) -> None:
    """`count` entries through the one write path, in one statement."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT warden_ledger_append('write_outcome', 'system', NULL, 'tool_call:' || n, p, "
            "'[\"write_outcome\",\"system\",null,\"tool_call:' || n || '\",' || p || ']') "
            "FROM generate_series(1, %s) AS n, LATERAL (SELECT '{\"n\":' || n || '}' AS p) AS payload ORDER BY n",
            [count])


def test_a_ledger_of_ten_thousand_entries_verifies_and_an_altered_payload_is_named():
    append_many(10_000)
    assert verify() == (0, f"ledger OK: 10000 entries, last #10000 {LedgerEntry.objects.get(seq=10_000).hash}\n")
    tamper("UPDATE approvals_app_ledgerentry SET payload = %s WHERE seq = %s", ['{"n":99999}', 4321])
    status, said = verify()
    assert status == 1 and said.startswith("ledger BROKEN at entry #4321: content altered"), said


def test_an_entry_whose_hash_was_recomputed_breaks_the_next_link():
    """Whoever edits an entry and gives it the hash of its new content breaks the link of the entry
    after it — unless they rewrite every later entry too, which an exported copy (a SIEM's) shows."""
    actor = UserFactory(username="chain")
    for i in range(5):
        ledger_append(kind=LedgerKind.FREEZE_SET, actor=actor, subject=f"freeze:{i}", payload={"i": i})
    third = LedgerEntry.objects.get(seq=3)
    forged = canonical_json({"i": 300})
    body = entry_body(kind=third.kind, actor=third.actor, actor_id=third.actor_id, subject=third.subject, payload=forged)
    tamper("UPDATE approvals_app_ledgerentry SET payload = %s, hash = %s WHERE seq = 3",
           [forged, entry_hash(prev_hash=third.prev_hash, seq=3, created_at=third.created_at, body=body)])
    status, said = verify()
    assert status == 1 and said.startswith("ledger BROKEN at entry #4: link broken"), said


def test_a_deleted_entry_is_reported_as_a_gap():
    append_many(6)
    tamper("DELETE FROM approvals_app_ledgerentry WHERE seq IN (3, 4)")
    status, said = verify()
    assert status == 1 and said.startswith("ledger BROKEN at entry #5: seq gap — entries 3–4 missing"), said


def test_an_empty_ledger_verifies():
    assert verify() == (0, "ledger OK: 0 entries\n")


# --- export ------------------------------------------------------------------------------------------

def _spread_entries(count: int) -> list[LedgerEntry]:
    actor = UserFactory(username="exporter")
    for i in range(count):
        ledger_append(kind=LedgerKind.FREEZE_SET, actor=actor, subject=f"freeze:{i}", payload={"i": i, "reason": "é,\"x\"\n"})
        time.sleep(0.002)
    return list(LedgerEntry.objects.order_by("seq"))


def siem_verifies(records: list[dict]) -> bool:
    """What a SIEM does with an export (docs/LEDGER.md, "Verifying an export"): each hash recomputed
    from the line itself, each prev_hash the hash of the line before."""
    for before, record in zip([None, *records], records):
        if before is not None and record["prev_hash"] != before["hash"]:
            return False
        body = "[" + ",".join(json.dumps(v, sort_keys=True, separators=(",", ":")) for v in (
            record["kind"], record["actor"], record["actor_id"], record["subject"], record["payload"])) + "]"
        content = f"{record['prev_hash']}\n{record['seq']}\n{record['created_at']}\n{body}"
        if hashlib.sha256(content.encode()).hexdigest() != record["hash"]:
            return False
    return True


def test_export_by_time_range_as_json_lines_and_csv(tmp_path):
    entries = _spread_entries(6)
    since, until = entries[1].created_at.isoformat(), entries[4].created_at.isoformat()

    out = io.StringIO()
    call_command("export_ledger", "--from", since, "--to", until, "--format", "jsonl", stdout=out)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["seq"] for r in records] == [2, 3, 4]  # from inclusive, to exclusive
    assert [r["hash"] for r in records] == [e.hash for e in entries[1:4]] and siem_verifies(records)
    assert records[0]["payload"] == {"i": 1, "reason": "é,\"x\"\n"}

    target = tmp_path / "ledger.csv"
    call_command("export_ledger", "--from", since, "--to", until, "--format", "csv", "--output", str(target))
    with target.open(newline="", encoding="utf-8") as exported:
        rows = list(csv.DictReader(exported))
    assert [int(row["seq"]) for row in rows] == [2, 3, 4]
    assert [(row["prev_hash"], row["hash"]) for row in rows] == [(e.prev_hash, e.hash) for e in entries[1:4]]
    assert rows[0]["payload"] == entries[1].payload and rows[0]["actor"] == "exporter"

    everything = io.StringIO()
    call_command("export_ledger", stdout=everything)
    assert len(everything.getvalue().splitlines()) == 6


def test_export_refuses_a_range_it_cannot_read():
    with pytest.raises(Exception, match="not an ISO 8601"):
        call_command("export_ledger", "--from", "yesterday")
    with pytest.raises(Exception, match="--from must be before --to"):
        call_command("export_ledger", "--from", "2026-12-02", "--to", "2026-12-01")


def test_the_export_permission_exists():
    assert Permission.objects.filter(content_type__app_label="approvals_app", codename="export_ledger").exists()
