"""Display helpers shared by the operators' desk (approval queue, unknown calls, runs, audit):
JSON an operator can read, how long something has waited and has left, money and cost."""

import json
from datetime import datetime
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from tools_app.models import ToolEffect
from tools_app.registry import tool_get


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


def span_text(seconds: float) -> str:
    """A length of time an operator reads at a glance: 42 s, 4 m 12 s, 3 h 05 m, 2 d 4 h —
    never "0 minutes"."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} m {seconds % 60:02d} s"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} m"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def age(since: datetime | None, now: datetime | None = None) -> str:
    if since is None:
        return "—"
    return span_text(((now or timezone.now()) - since).total_seconds())


def time_to_expiry(expires_at: datetime | None, now: datetime | None = None) -> str:
    now = now or timezone.now()
    if expires_at is None:
        return "—"
    if expires_at <= now:
        return f"expired {span_text((now - expires_at).total_seconds())} ago"
    return f"in {span_text((expires_at - now).total_seconds())}"


def countdown(expires_at: datetime | None, now: datetime | None = None) -> str:
    """The time left, kept ticking by desk.js (data-countdown); the text is right without it."""
    if expires_at is None:
        return "—"
    now = now or timezone.now()
    soon = " desk-soon" if (expires_at - now).total_seconds() < 3600 else ""
    return format_html('<time class="desk-countdown{}" datetime="{}" data-countdown="{}" title="{}">{}</time>', soon,
                       expires_at.isoformat(), expires_at.isoformat(), timezone.localtime(expires_at).strftime("%d %b %H:%M:%S %Z"),
                       time_to_expiry(expires_at, now))


def waited(since: datetime | None, now: datetime | None = None) -> str:
    """How long something has waited, ticking (data-since)."""
    if since is None:
        return "—"
    return format_html('<time class="desk-age" datetime="{}" data-since="{}">{}</time>', since.isoformat(), since.isoformat(),
                       age(since, now))


def money_of(tool_name: str, arguments: dict | None) -> str | None:
    """A call's amount with its currency, as its tool declares them (Tool.amount, .currency or
    .currency_argument), e.g. "11.00 USD"; None for a call that moves no declared amount."""
    tool = tool_get(tool_name)
    if tool is None or tool.amount is None:
        amount = amount_of(arguments)
        return None if amount is None else str(amount)
    return tool.money_text(arguments)


def request_label(tool_name: str, arguments: dict | None) -> str:
    """What a write is about, from its tool's declaration: its reference and counterparty
    ("order 9534", "reference INV-1 · account acme"); the arguments in short when it declares none."""
    tool = tool_get(tool_name)
    arguments = arguments or {}
    parts = [f"{_argument_label(name)} {arguments[name]}" for name in
             (getattr(tool, "reference", None), getattr(tool, "counterparty", None)) if name and name in arguments]
    if not parts and "order_id" in arguments:
        parts = [f"order {arguments['order_id']}"]
    return " · ".join(parts) or compact_arguments(arguments, 30)


def _argument_label(name: str) -> str:
    return name.removesuffix("_id").replace("_", " ")


def amount_of(arguments: dict | None) -> Decimal | None:
    try:
        return Decimal(str((arguments or {})["amount"]))
    except (KeyError, InvalidOperation, ValueError):
        return None


def cost_of(tokens: int) -> float:
    """The estimated cost of `tokens` model tokens (WARDEN_TOKEN_PRICE_PER_MILLION)."""
    return tokens * settings.WARDEN_TOKEN_PRICE_PER_MILLION / 1_000_000


def cost_text(tokens: int) -> str:
    cost = cost_of(tokens)
    return f"{cost:.4f}" if cost < 1 else f"{cost:.2f}"


def duration_of(start: datetime | None, end: datetime | None, now: datetime | None = None) -> str:
    if start is None:
        return "—"
    return span_text(((end or now or timezone.now()) - start).total_seconds()) + ("" if end else " …")


def badge(text: str, css: str) -> str:
    return format_html('<span class="desk-badge desk-{}">{}</span>', css, text)


def table(headers: list[str], rows: list[tuple]) -> str:
    """A small HTML table for read-only fields (rows are escaped cell by cell)."""
    head = format_html_join("", "<th>{}</th>", ((h,) for h in headers))
    body = format_html_join(
        "", "<tr>{}</tr>", ((format_html_join("", "<td>{}</td>", ((cell,) for cell in row)),) for row in rows)
    )
    return format_html('<table class="desk-table"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>', head, body)


# --- what a decision about one write shows beside it (the approve, reject, record-outcome pages) ---

def declared_fields(tool_call) -> list[tuple[str, str]]:
    """The business fields the call's tool declares (Tool.amount and its currency, .reference,
    .counterparty) and its business key, as (label, value) rows: "Amount", "25.00 USD"."""
    tool = tool_get(tool_call.tool_name)
    arguments = tool_call.arguments or {}
    rows = []
    if tool is not None and tool.amount is not None:
        rows.append(("Amount", tool.money_text(arguments) or f"— ({tool.amount} is not an amount)"))
    for what, name in (("Reference", getattr(tool, "reference", None)), ("Counterparty", getattr(tool, "counterparty", None))):
        if name:
            rows.append((f"{what} ({name})", str(arguments.get(name, "—"))))
    if tool is not None and tool.effect == ToolEffect.WRITE:
        rows.append(("Business key", tool_call.business_key or "none: deduplicated within its run only"))
    return rows


def _per_text(window) -> str:
    return {"customer": "this customer", "agent": "this agent"}.get(window.per, f"{_argument_label(window.per)} {window.value}")


def _sum_text(total, count, window) -> str:
    parts = []
    if window.max_amount is not None:
        parts.append(f"{total} {window.currency or ''}".strip())
    if window.max_count is not None or window.max_amount is None:
        parts.append(f"{count} call{'' if count == 1 else 's'}")
    return " · ".join(parts)


def limit_windows_table(windows) -> str:
    """The agent's limits on the call's tool (agents.selectors.tool_call_limit_windows): each
    window's total now, before and with this call, against the limit, in the call's currency."""
    if not windows:
        return format_html('<p class="desk-muted">{}</p>', "No limit of the agent's counts this tool.")
    rows = []
    for window in windows:
        limit = " · ".join(filter(None, [f"{window.max_amount} {window.currency or ''}".strip() if window.max_amount else "",
                                         f"{window.max_count} calls" if window.max_count else ""]))
        state = (format_html('<strong class="desk-over">over: {}</strong>', window.over or "refuse") if window.crossed
                 else "within")
        rows.append((window.window, _per_text(window), _sum_text(window.others_total, window.others_count, window),
                     format_html('<span class="desk-amount">{}</span>', _sum_text(window.total, window.count, window)),
                     limit, state))
    return labelled_table(["window", "per", "before this call", "with this call", "limit", "state"], rows)


def same_key_table(calls, *, business_key: str) -> str:
    """The other calls that asked for the same business key, with where they are."""
    if not business_key:
        return format_html('<p class="desk-muted">{}</p>', "This tool has no business key.")
    if not calls:
        return format_html('<p class="desk-muted">{}</p>', "No other call asked for it: this is the first.")
    return labelled_table(
        ["call", "run", "status", "created"],
        [(format_html('<a href="{}">{}</a>', reverse("admin:tools_app_toolcall_change", args=[c.pk]), str(c.pk)[:8]),
          format_html('<a href="{}">{}</a>', reverse("admin:runs_app_run_change", args=[c.run_id]), str(c.run_id)[:8]),
          badge(c.status + (" (answered by an earlier call)" if c.reused_from_id else ""), f"call-{c.status}"),
          age(c.created_at) + " ago")
         for c in calls],
    )


def message_text(message, limit: int = 500) -> str:
    """One message in words: its text, and the tools an assistant message asks for."""
    text = message.content if len(message.content) <= limit else message.content[:limit - 1] + "…"
    if message.tool_calls:
        asked = format_html_join(", ", "{}({})", ((c.get("name"), c.get("arguments")) for c in message.tool_calls))
        return format_html("{} <em>asks for</em> {}", text, asked)
    return text


def conversation_table(messages) -> str:
    if not messages:
        return format_html('<p class="desk-muted">{}</p>', "No messages.")
    return labelled_table(
        ["#", "who", "said", "when"],
        [(m.seq, m.role + (f" ({m.tool_name})" if m.tool_name else ""), message_text(m), age(m.created_at) + " ago")
         for m in messages],
    )


def read_results_table(calls) -> str:
    if not calls:
        return format_html('<p class="desk-muted">{}</p>', "No read tool ran in this run.")
    return labelled_table(["tool", "arguments", "result"],
                 [(call.tool_name, compact_arguments(call.arguments), pretty_json(call.result)) for call in calls])


def expiry_line(expires_at: datetime | None, *, pending: bool, now: datetime | None = None) -> str:
    """An approval's expiry on one line: the time left and when, while it waits; when it was due,
    once decided (or when it expired)."""
    if expires_at is None:
        return "never"
    when = timezone.localtime(expires_at).strftime("%d %b %Y %H:%M %Z")
    if pending:
        return format_html('{} <span class="desk-muted">({})</span>', countdown(expires_at, now), when)
    if expires_at <= (now or timezone.now()):
        return f"{when} (passed)"
    return f"was due by {when}"


def labelled_table(headers: list[str], rows: list[tuple]) -> str:
    """table(), each cell naming its column (data-label): on a phone a row becomes a card, each
    value under its label."""
    head = format_html_join("", "<th>{}</th>", ((h,) for h in headers))
    body = format_html_join("", "<tr>{}</tr>", (
        (format_html_join("", '<td data-label="{}">{}</td>', zip(headers, row)),) for row in rows))
    return format_html('<table class="desk-table desk-labelled"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>', head, body)
