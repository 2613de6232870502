"""Defining MCP servers (docs/EXTENDING.md, "MCP servers"): a save of a server's row — its credential,
when one is given, sealed (config.secrets) before it is stored and never returned — with an audit
entry naming who and what changed (for the credential, that it was set or removed, never its value).
Everything is checked first: a refusal names each wrong field and nothing is saved. `mcp_server_check`
asks the server for its tools now and keeps what it said, for the desk to compare with the tools the
agents' versions snapshotted."""

import json
import re
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from access import policy as access
from approvals_app.services import audit_record
from config.errors import WardenError
from config.secrets import secret_seal
from tools_app.errors import McpServerRefusal
from tools_app.mcp import McpUnavailable, mcp_tools_list
from tools_app.models import McpServer, McpTransport

NAME_PATTERN = r"[a-z0-9][a-z0-9-]{0,63}"
CREDENTIAL_MAX_LENGTH = 8000
MAX_TIMEOUT = 600
# The fields a save may change, and what the audit entry records of them.
FIELDS = ("name", "transport", "url", "command", "timeout_seconds")


class McpServerInvalid(WardenError):
    """`errors` maps each offending field to what is wrong with it (never echoing a credential)."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__(
            McpServerRefusal.INVALID_MCP_SERVER,
            "The MCP server was refused, nothing was saved: " + "; ".join(f"{f}: {m}" for f, m in errors.items()),
            fields=[{"field": f"body.{f}", "message": m, "type": McpServerRefusal.INVALID_MCP_SERVER.value}
                    for f, m in errors.items()],
        )


def mcp_credential_parse(text: str) -> dict[str, str]:
    """A credential as the desk takes it: a JSON object of header names (or, for stdio, environment
    variables) to values, or one line `Name: value`. McpServerInvalid without echoing it."""
    text = (text or "").strip()
    if len(text) > CREDENTIAL_MAX_LENGTH:
        raise McpServerInvalid({"credential": f"at most {CREDENTIAL_MAX_LENGTH} characters"})
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            raise McpServerInvalid({"credential": "not a JSON object of names to values"}) from None
    elif ":" in text:
        name, _, secret = text.partition(":")
        value = {name.strip(): secret.strip()}
    else:
        raise McpServerInvalid({"credential": 'a JSON object {"Authorization": "Bearer …"} or one line "Name: value"'})
    if not isinstance(value, dict) or not value or not all(
            isinstance(k, str) and k and isinstance(v, str) and v and all(0x20 <= ord(c) < 0x7F for c in k + v)
            for k, v in value.items()):
        raise McpServerInvalid({"credential": "names and values of printable ASCII text, none empty"})
    return value


def mcp_server_save(*, acting_user, fields: dict, credential: dict[str, str] | None = None,
                    clear_credential: bool = False, server: McpServer | None = None) -> McpServer:
    """Create (without `server`) or change a server. `credential`: new headers or environment to seal
    (None keeps the current one; `clear_credential` removes it)."""
    if not access.can_manage_mcp_servers(user=acting_user):
        raise WardenError(McpServerRefusal.NOT_PERMITTED, "Defining MCP servers needs the tools_app.change_mcpserver permission.")
    clean = _checked({**({f: getattr(server, f) for f in FIELDS} if server else {}), **fields})
    if server is not None and clean["name"] != server.name:
        # Agent versions and their calls find the server by its name.
        raise McpServerInvalid({"name": "a server keeps its name: agent versions name it; define a new one instead"})
    with transaction.atomic():
        before = {}
        if server is None:
            server = McpServer(**clean)
        else:
            server = McpServer.objects.select_for_update().get(pk=server.pk)
            before = {f: getattr(server, f) for f in FIELDS}
            for field, value in clean.items():
                setattr(server, field, value)
        credential_change = None
        if clear_credential and server.credential:
            server.credential, credential_change = "", "removed"
        elif credential:
            credential_change = "rotated" if server.credential else "set"
            server.credential = secret_seal(json.dumps(credential, sort_keys=True))
        try:
            with transaction.atomic():
                server.save()
        except IntegrityError:
            raise WardenError(McpServerRefusal.MCP_SERVER_NAME_TAKEN, f"An MCP server {clean['name']!r} exists already.") from None
        audit_record(actor=acting_user, action="define_mcp_server", obj=server, before=before,
                     after={**{f: getattr(server, f) for f in FIELDS},
                            **({"credential": credential_change} if credential_change else {})})
    return server


def _checked(values: dict) -> dict:
    errors: dict[str, str] = {}
    name = values.get("name")
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        errors["name"] = "lowercase letters, digits and hyphens, at most 64"
    transport = values.get("transport") or McpTransport.HTTP
    url = (values.get("url") or "").strip()
    command = values.get("command") or []
    if transport not in McpTransport.values:
        errors["transport"] = f"one of {', '.join(McpTransport.values)}"
    elif transport == McpTransport.HTTP:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
            errors["url"] = "an http(s) URL of the server's MCP endpoint, without a user or password in it (the credential holds those)"
        elif parts.query or parts.fragment:
            # The URL is shown on the desk and in errors; a key in its query would be too.
            errors["url"] = "the MCP endpoint without a query or fragment: a key goes in the credential, never in the URL"
        command = []
    else:
        if not settings.WARDEN_MCP_STDIO:
            errors["transport"] = "this deployment does not allow MCP servers that are local commands (WARDEN_MCP_STDIO)"
        if not isinstance(command, list) or not command or not all(isinstance(c, str) and c for c in command):
            errors["command"] = 'the command and its arguments, a JSON list such as ["python", "-m", "my_server"]'
        url = ""
    timeout = values.get("timeout_seconds", 30.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
        errors["timeout_seconds"] = f"seconds above 0, at most {MAX_TIMEOUT}"
    if errors:
        raise McpServerInvalid(errors)
    return {"name": name, "transport": transport, "url": url, "command": command, "timeout_seconds": float(timeout)}


def mcp_server_seen(*, server: McpServer, tools: list[dict] | None, error: str = "") -> None:
    """Keep what the server listed (or why it could not be asked) and when."""
    changes = {"tools_checked_at": timezone.now(), "check_error": error[:1000]}
    if tools is not None:
        changes["tools_seen"] = sorted(tools, key=lambda tool: tool["name"])
    McpServer.objects.filter(pk=server.pk).update(**changes)


def mcp_server_check(*, server: McpServer, acting_user) -> list[dict] | None:
    """Ask the server for its tools now (the desk's "Check tools"); None when it could not be asked."""
    if not access.can_manage_mcp_servers(user=acting_user):
        raise WardenError(McpServerRefusal.NOT_PERMITTED, "Checking MCP servers needs the tools_app.change_mcpserver permission.")
    try:
        tools = mcp_tools_list(server)
    except McpUnavailable as error:
        mcp_server_seen(server=server, tools=None, error=str(error))
        return None
    mcp_server_seen(server=server, tools=tools)
    return tools
