"""Display helpers shared by the operators' desk (approval queue, unknown calls, runs, audit):
JSON an operator can read, and how long something has waited."""

import json
from datetime import datetime

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.timesince import timesince, timeuntil


def pretty_json(value) -> str:
    """A <pre> block of indented JSON; '—' for nothing."""
    if value in (None, "", {}, []):
        return "—"
    return format_html('<pre class="desk-json">{}</pre>', json.dumps(value, indent=2, sort_keys=True, default=str))


def compact_arguments(arguments: dict | None, limit: int = 80) -> str:
    """One line for list pages: `order_id=9527, amount=25.00`."""
    if not arguments:
        return "—"
    text = ", ".join(f"{key}={value}" for key, value in arguments.items())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def age(since: datetime | None, now: datetime | None = None) -> str:
    if since is None:
        return "—"
    return timesince(since, now or timezone.now())


def time_to_expiry(expires_at: datetime | None, now: datetime | None = None) -> str:
    now = now or timezone.now()
    if expires_at is None:
        return "—"
    if expires_at <= now:
        return f"expired {timesince(expires_at, now)} ago"
    return f"in {timeuntil(expires_at, now)}"


def table(headers: list[str], rows: list[tuple]) -> str:
    """A small HTML table for read-only fields (rows are escaped cell by cell)."""
    head = format_html_join("", "<th>{}</th>", ((h,) for h in headers))
    body = format_html_join(
        "", "<tr>{}</tr>", ((format_html_join("", "<td>{}</td>", ((cell,) for cell in row)),) for row in rows)
    )
    return format_html('<table class="desk-table"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>', head, body)
