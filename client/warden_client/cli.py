"""`warden`, the command line over the client: sessions, saying something, a session's events
live, runs, approvals. Global options (before or after the command): `--url` (WARDEN_URL),
`--api-key` (WARDEN_API_KEY), `--json` (machine-readable output: one JSON document, or one JSON
object per line for `tail`). An error is one line on stderr — `warden: <code> (<status>):
<message> [request <id>]` — and exit status 1 (2: the command line itself is wrong; 130: interrupted)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from itertools import islice
from typing import TYPE_CHECKING, Any, TextIO

import httpx

from warden_client import __version__
from warden_client._core import ReconnectPolicy
from warden_client.client import Warden
from warden_client.errors import WardenError
from warden_client.models import TERMINAL_STATUSES, Event, Resource

if TYPE_CHECKING:
    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]
Handler = Callable[[Warden, argparse.Namespace, "Output"], int]

# The API lists pending approvals unless told otherwise, and has no "any status".
APPROVAL_STATUSES = ["pending", "approved", "rejected", "expired", "withdrawn"]
TAIL_RECONNECT = ReconnectPolicy(max_attempts=40, backoff=0.5, max_backoff=10.0)

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    out = Output(json_mode=args.json, stream=sys.stdout)
    try:
        with Warden(args.url, args.api_key) as client:
            if not client.api_key:
                print("warden: no API key: pass --api-key or set WARDEN_API_KEY", file=sys.stderr)
                return EXIT_USAGE
            return args.handler(client, args, out) or 0
    except WardenError as error:
        print(f"warden: {error}", file=sys.stderr)
        return EXIT_ERROR
    except (httpx.HTTPError, httpx.InvalidURL) as error:  # `--url localhost:8000` (no scheme), say
        print(f"warden: bad_url: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `warden runs list | head`
        return 0


# --- the command line ------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="warden", description="Warden's HTTP API from the command line.")
    parser.add_argument("--version", action="version", version=f"warden-client {__version__}")
    _global_options(parser, defaults=True)
    commands = parser.add_subparsers(title="commands", metavar="<command>")

    def command(group: Subcommands, name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
        sub = group.add_parser(name, help=help, description=help)
        _global_options(sub, defaults=False)
        sub.set_defaults(handler=handler)
        return sub

    sessions = commands.add_parser("sessions", help="create, list and show sessions").add_subparsers(metavar="<action>")
    new = command(sessions, "new", _sessions_new, "create a session; prints its id")
    new.add_argument("--title", default="")
    new.add_argument("--agent", help="the agent's slug (default: the deployment's)")
    listing = command(sessions, "list", _sessions_list, "the sessions you may see, newest first")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    show = command(sessions, "show", _sessions_show, "a session and its latest messages")
    show.add_argument("session")

    say = command(commands, "say", _say, "say something in a session: starts a run or gives the input to the active one")
    say.add_argument("session")
    say.add_argument("text", nargs="+")
    say.add_argument("--mode", choices=["auto", "supplement", "new_intent", "queue"])

    tail = command(commands, "tail", _tail, "a session's events live, one line each, until Ctrl-C")
    tail.add_argument("session")
    tail.add_argument("--after", help="start after this event id (a cursor `tail --json` prints); default: from the start")
    tail.add_argument("--until-idle", action="store_true",
                      help="exit once a run has ended and the session has no active run")

    runs = commands.add_parser("runs", help="list, show and steer runs").add_subparsers(metavar="<action>")
    listing = command(runs, "list", _runs_list, "runs you may see, newest first")
    listing.add_argument("--q", help="search as the desk does: a business reference, order, key, customer, id")
    listing.add_argument("--agent", help="the agent's slug")
    listing.add_argument("--status", action="append", help="repeat for several")
    listing.add_argument("--outcome", action="append", help="applied, not_applied, rejected, expired, none; repeatable")
    listing.add_argument("--session")
    listing.add_argument("--tool", help="runs that called this tool")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    show = command(runs, "show", _runs_show, "a run: status, tool calls, approvals, latest events")
    show.add_argument("run")
    tail_run = command(runs, "tail", _runs_tail, "a run's events live until it ends")
    tail_run.add_argument("run")
    cancel = command(runs, "cancel", _runs_cancel, "ask a run to stop")
    cancel.add_argument("run")
    cancel.add_argument("--reason", default="")
    retry = command(runs, "retry", _runs_retry, "try a failed or cancelled run again as a new run")
    retry.add_argument("run")
    retry.add_argument("--reason", default="")

    approvals = commands.add_parser("approvals", help="the approval queue (operators' keys)").add_subparsers(
        metavar="<action>")
    listing = command(approvals, "list", _approvals_list, "pending approvals you may decide, oldest first")
    listing.add_argument("--all", action="store_true", help="every approval you may see, not only yours to decide")
    listing.add_argument("--limit", type=int, default=50)
    approve = command(approvals, "approve", _approvals_approve, "approve: the run goes on")
    approve.add_argument("approval")
    approve.add_argument("--reason", default="", help="an internal note for the desk and the audit trail")
    reject = command(approvals, "reject", _approvals_reject, "reject: the write is cancelled, the model told so")
    reject.add_argument("approval")
    reject.add_argument("--reason", default="", help="an internal note for the desk and the audit trail")
    reject.add_argument("--customer-message", default="", help="what the customer is told")

    command(commands, "me", _me, "who the API key belongs to")
    return parser


def _global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    # On the command too (`warden runs list --json`): there a default would hide the global one.
    parser.add_argument("--url", default=None if defaults else argparse.SUPPRESS,
                        help="the server's root URL (env WARDEN_URL; default http://localhost:8000)")
    parser.add_argument("--api-key", default=None if defaults else argparse.SUPPRESS,
                        help="an API key, wdn_… (env WARDEN_API_KEY)")
    parser.add_argument("--json", action="store_true", default=False if defaults else argparse.SUPPRESS,
                        help="machine-readable output")


# --- output ----------------------------------------------------------------------------------------

class Output:
    def __init__(self, *, json_mode: bool, stream: TextIO):
        self.json_mode = json_mode
        self.stream = stream

    def line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def document(self, value: Resource | list[Resource] | dict[str, Any]) -> None:
        print(json.dumps(_jsonable(value), indent=2, ensure_ascii=False), file=self.stream, flush=True)

    def json_line(self, value: Resource | dict[str, Any]) -> None:
        print(json.dumps(_jsonable(value), ensure_ascii=False), file=self.stream, flush=True)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Event):
        return {"id": value.id, "run_id": value.run_id, **value.raw}
    if isinstance(value, Resource):
        return value.raw
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    return value


def _when(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _short(text: object, width: int = 80) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def event_line(event: Event) -> str:
    """One human-readable line for an event: time, run, seq, type, what happened."""
    clock = event.created_at.astimezone().strftime("%H:%M:%S") if event.created_at else "--:--:--"
    return f"{clock}  run {event.run_id[:8]}  #{event.seq:<3} {event.type:<20} {event_summary(event)}".rstrip()


def event_summary(event: Event) -> str:
    p = event.payload if isinstance(event.payload, dict) else {}
    if event.type == "run_status":
        parts = [p.get("status", "?")]
        parts += [value for value in (p.get("phase"), p.get("wait_reason")) if value]
        if p.get("outcome"):
            parts.append(f"outcome {p['outcome']}")
        if p.get("error_code"):
            parts.append(f"error {p['error_code']}")
        return " / ".join(parts)
    if event.type in ("step_started", "step_completed"):
        text = f"step {p.get('step', '?')} {p.get('kind', '')}".rstrip()
        return f"{text}: {_short(p['text'])}" if p.get("text") else text
    if event.type == "tool_call":
        money = f" {p['money']}" if p.get("money") else ""
        message = f" — {_short(p['message'], 60)}" if p.get("message") else ""
        return f"{p.get('tool', '?')} {p.get('status', '')}{money}{message}"
    if event.type.startswith("approval_"):
        who = f" by {p['decided_by']}" if p.get("decided_by") else ""
        return f"{p.get('tool', '')} {p.get('status', '')}{who} (approval {str(p.get('approval', ''))[:8]})".strip()
    scalars = [f"{key}={_short(value, 40)}" for key, value in p.items() if isinstance(value, (str, int, float, bool))]
    return " ".join(scalars[:4])


def _take(items: Iterable[Any], limit: int) -> list[Any]:
    return list(islice(items, max(limit, 0)))


# --- the commands ----------------------------------------------------------------------------------

def _sessions_new(client: Warden, args: argparse.Namespace, out: Output) -> int:
    session = client.sessions.create(title=args.title, agent=args.agent)
    out.document(session) if out.json_mode else out.line(session.id)
    return 0


def _sessions_list(client: Warden, args: argparse.Namespace, out: Output) -> int:
    sessions = _take(client.sessions.iter(limit=min(max(args.limit, 1), 200)), args.limit)
    if out.json_mode:
        out.document(sessions)
        return 0
    for s in sessions:
        active = f"active run {s.active_run_id}" if s.active_run_id else "idle"
        out.line(f"{s.id}  {_when(s.created_at)}  {s.message_count:>3} messages  {active:<48}  {_short(s.title, 40)}")
    return 0


def _sessions_show(client: Warden, args: argparse.Namespace, out: Output) -> int:
    session = client.sessions.get(args.session)
    if out.json_mode:
        out.document(session)
        return 0
    out.line(f"session {session.id}  {session.title!r}  owner {session.owner}  agent {session.agent or '-'}")
    out.line(f"active run: {session.active_run_id or 'none'}")
    for message in session.messages:
        out.line(f"  #{message.seq:<3} {message.role:<9} {_short(message.content, 100)}")
    for pending in session.pending_inputs:
        out.line(f"  pending ({pending.mode}): {_short(pending.content, 100)}")
    return 0


def _say(client: Warden, args: argparse.Namespace, out: Output) -> int:
    posted = client.sessions.say(args.session, " ".join(args.text), mode=args.mode)
    if out.json_mode:
        out.document(posted)
    else:
        out.line(f"{posted.disposition}: run {posted.run.id} ({posted.run.status})")
    return 0


def _tail(client: Warden, args: argparse.Namespace, out: Output) -> int:
    # Someone watching (or a script waiting) outlasts a server's restart: minutes, not seconds.
    client.reconnect = TAIL_RECONNECT
    for event in client.sessions.stream(args.session, after=args.after):
        out.json_line(event) if out.json_mode else out.line(event_line(event))
        if args.until_idle and _run_ended(event) and client.sessions.get(args.session).active_run_id is None:
            return 0
    return 0


def _run_ended(event: Event) -> bool:
    return event.type == "run_status" and isinstance(event.payload, dict) and event.payload.get("status") in TERMINAL_STATUSES


def _runs_list(client: Warden, args: argparse.Namespace, out: Output) -> int:
    runs = _take(client.runs.iter(q=args.q, agent=args.agent, status=args.status, outcome=args.outcome,
                                  session=args.session, tool=args.tool, limit=min(max(args.limit, 1), 200)), args.limit)
    if out.json_mode:
        out.document(runs)
        return 0
    for run in runs:
        money = ", ".join(str(moved) for moved in run.money_moved) or "-"
        out.line(f"{run.id}  {_when(run.created_at)}  {run.status:<9}  {run.outcome or '-':<11}  {money:<12}  "
                 f"{run.agent or '-':<16}  {_short(run.title, 40)}")
    return 0


def _runs_show(client: Warden, args: argparse.Namespace, out: Output) -> int:
    run = client.runs.get(args.run)
    if out.json_mode:
        out.document(run)
        return 0
    state = " / ".join(value for value in (run.status, run.phase, run.wait_reason) if value)
    out.line(f"run {run.id}  {state}  outcome {run.outcome or '-'}")
    out.line(f"session {run.session_id}  agent {(run.agent or {}).get('slug', '-')}  created {_when(run.created_at)}"
             f"  finished {_when(run.finished_at)}")
    out.line(f"model calls {run.model_calls}  tokens {run.tokens_used}  events {run.event_seq}")
    if run.error:
        out.line(f"error {run.error.get('code')}: {run.error.get('detail')}")
    for call in run.tool_calls:
        money = f"  {call.money}" if call.money else ""
        out.line(f"  tool {call.tool_name:<20} {call.status:<10}{money}  {json.dumps(call.arguments, ensure_ascii=False)}")
    for approval in run.approvals:
        out.line(f"  approval {approval.id}  {approval.policy}  {approval.status}"
                 f"{'  by ' + approval.decided_by if approval.decided_by else ''}")
    return 0


def _runs_tail(client: Warden, args: argparse.Namespace, out: Output) -> int:
    client.reconnect = TAIL_RECONNECT
    for event in client.runs.stream(args.run):
        out.json_line(event) if out.json_mode else out.line(event_line(event))
    return 0


def _runs_cancel(client: Warden, args: argparse.Namespace, out: Output) -> int:
    run = client.runs.cancel(args.run, reason=args.reason)
    out.document(run) if out.json_mode else out.line(f"cancel requested: run {run.id} ({run.status})")
    return 0


def _runs_retry(client: Warden, args: argparse.Namespace, out: Output) -> int:
    run = client.runs.retry(args.run, reason=args.reason)
    out.document(run) if out.json_mode else out.line(f"retried as run {run.id} ({run.status})")
    return 0


def _approvals_list(client: Warden, args: argparse.Namespace, out: Output) -> int:
    approvals = _take(client.approvals.iter(decidable=False if args.all else None,
                                            status=APPROVAL_STATUSES if args.all else None,
                                            limit=min(max(args.limit, 1), 200)), args.limit)
    if out.json_mode:
        out.document(approvals)
        return 0
    for a in approvals:
        money = f"  {a.tool_call.money}" if a.tool_call.money else ""
        out.line(f"{a.id}  {a.status:<8}  {a.policy:<8}  {a.tool_call.tool_name}{money}  run {a.run_id}"
                 f"  expires {_when(a.expires_at)}")
    return 0


def _approvals_approve(client: Warden, args: argparse.Namespace, out: Output) -> int:
    approval = client.approvals.approve(args.approval, note=args.reason)
    out.document(approval) if out.json_mode else out.line(f"{approval.status}: approval {approval.id}")
    return 0


def _approvals_reject(client: Warden, args: argparse.Namespace, out: Output) -> int:
    approval = client.approvals.reject(args.approval, note=args.reason, customer_message=args.customer_message)
    out.document(approval) if out.json_mode else out.line(f"{approval.status}: approval {approval.id}")
    return 0


def _me(client: Warden, args: argparse.Namespace, out: Output) -> int:
    me = client.me()
    if out.json_mode:
        out.document(me)
    else:
        granted = ", ".join(name for name, allowed in me.permissions.items() if allowed) or "none"
        out.line(f"{me.username} (operator permissions: {granted})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
