"""The tamper-evident ledger over HTTP (docs/LEDGER.md): its entries of a time range, streamed as JSON
lines or CSV for a SIEM, each with its seq, hash and prev_hash so the receiver verifies the chain
itself. Needs approvals_app.export_ledger; without it, 403. `manage.py export_ledger` writes the same."""

from typing import Literal

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import connections
from django.http import StreamingHttpResponse
from ninja import Query, Router

from access import policy as access
from api.base import COMMON_ERRORS, Timestamp, errors
from api.errors import ApiRefusal
from approvals_app.ledger import (
    EXPORT_CONTENT_TYPES,
    ledger_export,
    ledger_export_header,
    ledger_export_lines,
    ledger_page,
)
from config.errors import CommonRefusal, WardenError

router = Router(tags=["ledger"])

# The 200 answer is no JSON document but a stream of lines in the format asked for.
EXPORT_RESPONSES = {"responses": {"200": {"description": "The entries of the range, oldest first (seq order)", "content": {
    EXPORT_CONTENT_TYPES["jsonl"]: {"schema": {"type": "string", "description": "one JSON object per line: seq, created_at, "
                                               "kind, actor, actor_id, subject, payload, prev_hash, hash"}},
    EXPORT_CONTENT_TYPES["csv"]: {"schema": {"type": "string", "description": "a header row, then one row per entry"}},
}}}}


@router.get("", response={**COMMON_ERRORS, **errors(403)}, summary="Export the ledger", openapi_extra=EXPORT_RESPONSES)
def ledger_export_range(
    request,
    since: Timestamp | None = Query(None, alias="from", description="inclusive, ISO 8601 (UTC if no offset); "
                                                                      "default: the first entry"),
    until: Timestamp | None = Query(None, alias="to", description="exclusive; default: now"),
    fmt: Literal["jsonl", "csv"] = Query("jsonl", alias="format", description="`jsonl` (JSON lines) or `csv`"),
):
    """Every human decision and money-moving outcome appended in [from, to), in seq order. Verify
    the chain as docs/LEDGER.md says: each `prev_hash` is the hash of the entry before, each `hash`
    the SHA-256 of its content."""
    if not access.can_export_ledger(user=request.auth):
        raise WardenError(CommonRefusal.NOT_PERMITTED, "Exporting the ledger needs the approvals_app.export_ledger permission.")
    if since is not None and until is not None and since >= until:
        raise WardenError(ApiRefusal.INVALID_VALUE, "`from` must be before `to`.",
                          fields=[{"field": "query.to", "message": "must be after `from`",
                                   "type": ApiRefusal.INVALID_VALUE.value}])
    # Under ASGI (daphne) the body must be an async iterator, or Django would buffer the whole
    # export before sending it; under WSGI and the test client a plain generator.
    content = (_export_async(since=since, until=until, fmt=fmt) if isinstance(request, ASGIRequest)
               else ledger_export(since=since, until=until, fmt=fmt))
    response = StreamingHttpResponse(content, content_type=f"{EXPORT_CONTENT_TYPES[fmt]}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="warden-ledger.{fmt}"'
    response["Cache-Control"] = "no-store"
    return response


async def _export_async(*, since, until, fmt: str):
    yield ledger_export_header(fmt)
    read = sync_to_async(_page_and_release)
    after = 0
    while True:
        page = await read(since=since, until=until, after_seq=after)
        if page:
            yield ledger_export_lines(page, fmt=fmt)
        if len(page) < PAGE_SIZE:
            return
        after = page[-1].seq


PAGE_SIZE = 1000


def _page_and_release(**kwargs):
    """A page, and no database connection held until the next (the web process's pool is shared)."""
    try:
        return ledger_page(**kwargs, size=PAGE_SIZE)
    finally:
        for conn in connections.all(initialized_only=True):
            if not conn.in_atomic_block:
                conn.close_if_unusable_or_obsolete()
