"""The tamper-evident ledger (issue 31, docs/LEDGER.md): every human decision about money and every
outcome of a money-moving call, appended in the transaction that makes the change, each entry
hashing the one before it. `ledger_append` is its one write path; `ledger_verify` walks the chain;
`ledger_export_*` write it out for a SIEM, each line carrying what is needed to verify it again."""

import csv
import hashlib
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone as dt_timezone
from typing import Any

from django.db import connection
from django.db.models import QuerySet, TextChoices

from approvals_app.models import Approval, Delegation, Freeze, LedgerEntry
from sessions_app.services import session_lock_of_run
from tools_app.models import ToolCall, ToolCallStatus, ToolEffect
from tools_app.services import tool_call_digest

# The hash the first entry points back to.
GENESIS_HASH = "0" * 64
SYSTEM_ACTOR = "system"


class LedgerKind(TextChoices):
    APPROVAL_APPROVE = "approval_approve"  # one person's approval (of a quorum too)
    APPROVAL_REJECT = "approval_reject"
    APPROVAL_EDIT = "approval_edit"  # the arguments changed before the decision, both digests
    FREEZE_SET = "freeze_set"
    FREEZE_LIFT = "freeze_lift"
    DELEGATION_SET = "delegation_set"  # who may decide in whose name, and when
    DELEGATION_REVOKE = "delegation_revoke"
    WRITE_OUTCOME = "write_outcome"  # a write call succeeded, failed, became unknown or was cancelled
    WRITE_RECONCILED = "write_reconciled"  # an unknown write settled, by the sweeper or an operator
    WRITE_REUSED = "write_reused"  # answered by an earlier call with its key, nothing sent


# Where a write call's outcome goes on the ledger: every status a write ends in, and `unknown`.
LEDGER_OUTCOMES = frozenset({ToolCallStatus.SUCCEEDED, ToolCallStatus.FAILED, ToolCallStatus.UNKNOWN,
                             ToolCallStatus.CANCELLED})


# --- the canonical form (docs/LEDGER.md, "What is hashed") ----------------------------------------

def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, ASCII only (anything else escaped): one text per value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def timestamp_text(moment: datetime) -> str:
    """The entry's time as hashed: UTC, microseconds, `Z` (the SQL function writes the same)."""
    return moment.astimezone(dt_timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def entry_body(*, kind: str, actor: str, actor_id: int | None, subject: str, payload: str) -> str:
    """The entry's content: a JSON array [kind, actor, actor_id, subject, payload], the payload
    verbatim (it is canonical already)."""
    return f"[{canonical_json(kind)},{canonical_json(actor)},{canonical_json(actor_id)},{canonical_json(subject)},{payload}]"


def entry_hash(*, prev_hash: str, seq: int, created_at: datetime | str, body: str) -> str:
    moment = created_at if isinstance(created_at, str) else timestamp_text(created_at)
    return hashlib.sha256(f"{prev_hash}\n{seq}\n{moment}\n{body}".encode("ascii")).hexdigest()


# --- the one write path ----------------------------------------------------------------------------

def ledger_append(*, kind: str, actor, subject: str, payload: dict) -> int:
    """Append an entry in the caller's transaction and return its seq. One statement: the SQL
    function `warden_ledger_append` (migration approvals_app/0011) takes the ledger's lock until
    the transaction ends, reads the last entry, stamps the time (never before the last one's) and
    hashes. So entries are numbered in commit order, the chain never forks, and a change that
    rolls back takes its entry with it. Taken as late in a transaction as possible: every append
    waits for the one before it to commit."""
    actor_name = actor.get_username() if actor is not None else SYSTEM_ACTOR
    actor_id = actor.pk if actor is not None else None
    text = canonical_json(payload)
    body = entry_body(kind=kind, actor=actor_name, actor_id=actor_id, subject=subject, payload=text)
    with connection.cursor() as cursor:
        cursor.execute("SELECT warden_ledger_append(%s, %s, %s, %s, %s, %s)",
                       [kind, actor_name, actor_id, subject, text, body])
        return cursor.fetchone()[0]


def ledger_approval_decision(*, approval: Approval, decision: str, acting_user, note: str, status: str,
                             approved_by: list[str] | None = None, on_behalf_of=None) -> int:
    """One person's approve or reject, bound to the digest of the call they decided on — and, for a
    stand-in's, whom they stood in for (both names are the decision's)."""
    payload = {
        "approval": str(approval.pk), "tool_call": str(approval.tool_call_id), "run": str(approval.run_id),
        "tool": approval.tool_call.tool_name, "decision": decision, "status": status,
        "digest": tool_call_digest(approval.tool_call), "required_approvals": approval.required_approvals,
        "note": note,
    }
    if approved_by is not None:
        payload["approved_by"] = approved_by
    if on_behalf_of is not None:
        payload["on_behalf_of"] = on_behalf_of.get_username()
        payload["on_behalf_of_id"] = on_behalf_of.pk
    kind = LedgerKind.APPROVAL_APPROVE if decision == "approve" else LedgerKind.APPROVAL_REJECT
    return ledger_append(kind=kind, actor=acting_user, subject=f"approval:{approval.pk}", payload=payload)


def ledger_approval_edit(*, approval: Approval, acting_user, digest_before: str, reason: str,
                         before: dict, after: dict, approvals_voided: list[str]) -> int:
    return ledger_append(kind=LedgerKind.APPROVAL_EDIT, actor=acting_user, subject=f"approval:{approval.pk}", payload={
        "approval": str(approval.pk), "tool_call": str(approval.tool_call_id), "run": str(approval.run_id),
        "tool": approval.tool_call.tool_name, "digest_before": digest_before, "digest_after": approval.digest,
        "idempotency_key_before": before.get("idempotency_key"), "idempotency_key_after": after.get("idempotency_key"),
        "policy_before": before.get("policy"), "policy_after": after.get("policy"),
        "required_approvals_before": before.get("required_approvals"),
        "required_approvals_after": after.get("required_approvals"),
        "approvals_voided": approvals_voided, "reason": reason,
    })


def ledger_freeze(*, freeze: Freeze, acting_user, lifted: bool) -> int:
    payload = {"freeze": freeze.pk, "scope": freeze.scope, "target": freeze.target, "mode": freeze.mode}
    payload |= {"note": freeze.lift_note} if lifted else {"reason": freeze.reason}
    return ledger_append(kind=LedgerKind.FREEZE_LIFT if lifted else LedgerKind.FREEZE_SET, actor=acting_user,
                         subject=f"freeze:{freeze.pk}", payload=payload)


def ledger_delegation(*, delegation: Delegation, acting_user, revoked: bool) -> int:
    """A delegation set or revoked: a stand-in's decisions are only as good as the delegation they
    were made under, so its period and both people are on the chain too."""
    payload = {"delegation": delegation.pk, "delegator": delegation.delegator.get_username(),
               "delegator_id": delegation.delegator_id, "delegate": delegation.delegate.get_username(),
               "delegate_id": delegation.delegate_id, "starts_at": timestamp_text(delegation.starts_at),
               "ends_at": timestamp_text(delegation.ends_at)}
    payload |= {"revoked_at": timestamp_text(delegation.revoked_at)} if revoked else {"reason": delegation.reason}
    return ledger_append(kind=LedgerKind.DELEGATION_REVOKE if revoked else LedgerKind.DELEGATION_SET, actor=acting_user,
                         subject=f"delegation:{delegation.pk}", payload=payload)


def ledger_tool_call_outcome(*, tool_call: ToolCall, was: str, acting_user=None) -> int | None:
    """A write call reached `tool_call.status` from `was`: its outcome, a reconciliation (from
    `unknown`) or an answer from the call it reuses. Reads move no money: None, nothing written.
    The arguments and result stay on the call (and go with it on erasure); the ledger binds them
    by digest."""
    if tool_call.effect != ToolEffect.WRITE or tool_call.status not in LEDGER_OUTCOMES:
        return None
    # The session's lock before the ledger's, always: a worker's outcome is appended before its
    # commit touches the session, and whoever holds the session (a decision, a reconciliation, a
    # run ending) may append too — taken in opposite orders, the two would deadlock.
    session_lock_of_run(run_id=tool_call.run_id)
    if was == ToolCallStatus.UNKNOWN:
        kind = LedgerKind.WRITE_RECONCILED
    elif tool_call.reused_from_id:
        kind = LedgerKind.WRITE_REUSED
    else:
        kind = LedgerKind.WRITE_OUTCOME
    payload = {
        "tool_call": str(tool_call.pk), "run": str(tool_call.run_id), "tool": tool_call.tool_name,
        "from": was, "status": tool_call.status, "error_code": tool_call.error_code,
        "idempotency_key": tool_call.idempotency_key, "business_key": tool_call.business_key,
        "digest": tool_call_digest(tool_call), "attempts": tool_call.attempts,
    }
    if kind == LedgerKind.WRITE_RECONCILED:
        payload |= {"resolution": tool_call.resolution, "evidence": tool_call.evidence}
    if tool_call.reused_from_id:
        payload["reused_from"] = str(tool_call.reused_from_id)
    return ledger_append(kind=kind, actor=acting_user, subject=f"tool_call:{tool_call.pk}", payload=payload)


# --- verification ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LedgerBreak:
    seq: int
    problem: str  # "content_altered", "link_broken", "seq_gap"
    detail: str


@dataclass(frozen=True)
class LedgerCheck:
    entries: int
    last_seq: int
    last_hash: str
    broken: LedgerBreak | None

    @property
    def ok(self) -> bool:
        return self.broken is None


def ledger_verify(*, batch: int = 5000) -> LedgerCheck:
    """Walk the chain in seq order and recompute each hash: the first entry whose content does not
    give its hash (altered), whose prev_hash is not the hash of the entry before (a link broken: an
    entry inserted or replaced), or whose seq does not follow (entries removed)."""
    expected_seq, prev_hash, count = 1, GENESIS_HASH, 0
    for entry in _entries_in_order(batch=batch):
        count += 1
        if entry.seq != expected_seq:
            missing = (f"entry {expected_seq}" if entry.seq == expected_seq + 1
                       else f"entries {expected_seq}–{entry.seq - 1}")
            return LedgerCheck(count, entry.seq, entry.hash, LedgerBreak(
                entry.seq, "seq_gap", f"{missing} missing before entry {entry.seq}: removed"))
        if entry.prev_hash != prev_hash:
            return LedgerCheck(count, entry.seq, entry.hash, LedgerBreak(
                entry.seq, "link_broken", f"prev_hash {entry.prev_hash[:16]}… is not the hash of entry "
                                          f"{entry.seq - 1} ({prev_hash[:16]}…)"))
        body = entry_body(kind=entry.kind, actor=entry.actor, actor_id=entry.actor_id, subject=entry.subject,
                          payload=entry.payload)
        computed = entry_hash(prev_hash=entry.prev_hash, seq=entry.seq, created_at=entry.created_at, body=body)
        if computed != entry.hash:
            return LedgerCheck(count, entry.seq, entry.hash, LedgerBreak(
                entry.seq, "content_altered", f"its content hashes to {computed[:16]}…, not its recorded "
                                              f"{entry.hash[:16]}…"))
        expected_seq, prev_hash = entry.seq + 1, entry.hash
    return LedgerCheck(count, expected_seq - 1, prev_hash, None)


def _entries_in_order(*, batch: int) -> Iterator[LedgerEntry]:
    """Keyset pages by seq: constant memory whatever the ledger's length."""
    after = 0
    while True:
        page = list(LedgerEntry.objects.filter(seq__gt=after).order_by("seq")[:batch])
        yield from page
        if len(page) < batch:
            return
        after = page[-1].seq


# --- export ----------------------------------------------------------------------------------------

EXPORT_FORMATS = ("jsonl", "csv")
EXPORT_CONTENT_TYPES = {"jsonl": "application/x-ndjson", "csv": "text/csv"}
CSV_COLUMNS = ("seq", "created_at", "kind", "actor", "actor_id", "subject", "payload", "prev_hash", "hash")


def ledger_entries(*, since: datetime | None = None, until: datetime | None = None) -> QuerySet[LedgerEntry]:
    """The entries of [since, until), in seq order (which is time order: the function never stamps
    an entry before the last)."""
    entries = LedgerEntry.objects.order_by("seq")
    if since is not None:
        entries = entries.filter(created_at__gte=since)
    if until is not None:
        entries = entries.filter(created_at__lt=until)
    return entries


def ledger_page(*, since: datetime | None, until: datetime | None, after_seq: int = 0,
                size: int = 1000) -> list[LedgerEntry]:
    """The next page of [since, until) after `after_seq`: exports read keyset pages, never the
    whole range at once (nor hold a cursor between pages)."""
    return list(ledger_entries(since=since, until=until).filter(seq__gt=after_seq)[:size])


def ledger_pages(*, since: datetime | None, until: datetime | None, size: int = 1000) -> Iterator[list[LedgerEntry]]:
    after = 0
    while True:
        page = ledger_page(since=since, until=until, after_seq=after, size=size)
        if page:
            yield page
        if len(page) < size:
            return
        after = page[-1].seq


def ledger_entry_record(entry: LedgerEntry) -> dict:
    """One exported entry: every field the hash covers, as hashed (payload as the JSON it is)."""
    return {"seq": entry.seq, "created_at": timestamp_text(entry.created_at), "kind": entry.kind, "actor": entry.actor,
            "actor_id": entry.actor_id, "subject": entry.subject, "payload": json.loads(entry.payload),
            "prev_hash": entry.prev_hash, "hash": entry.hash}


def ledger_export_header(fmt: str) -> str:
    """What an export starts with: CSV's header row; nothing for JSON lines."""
    return ",".join(CSV_COLUMNS) + "\n" if fmt == "csv" else ""


def ledger_export_lines(entries: Iterable[LedgerEntry], *, fmt: str) -> str:
    """The entries as JSON lines, or as CSV rows (the payload column holds its canonical JSON text)."""
    if fmt == "jsonl":
        return "".join(canonical_json(ledger_entry_record(entry)) + "\n" for entry in entries)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for entry in entries:
        writer.writerow([entry.seq, timestamp_text(entry.created_at), entry.kind, entry.actor,
                         "" if entry.actor_id is None else entry.actor_id, entry.subject, entry.payload,
                         entry.prev_hash, entry.hash])
    return buffer.getvalue()


def ledger_export(*, since: datetime | None, until: datetime | None, fmt: str) -> Iterator[str]:
    """The whole export of [since, until), a page of entries at a time."""
    yield ledger_export_header(fmt)
    for page in ledger_pages(since=since, until=until):
        yield ledger_export_lines(page, fmt=fmt)
