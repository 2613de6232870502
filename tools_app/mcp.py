"""Tools that live on Model Context Protocol servers, behind the same barrier as the deployment's own
(docs/EXTENDING.md, "MCP servers").

An agent version names MCP servers and the tools it chose from each; saving it lists the servers'
tools and keeps what they said (`mcp_snapshot_take` → AgentVersion.mcp_tools). A run builds its
tools from that snapshot (`mcp_tool_build`), so the server changing its tools changes no run. A
snapshot's tool is a registry `Tool` like any other: its arguments are checked against the server's
JSON schema before anything is sent (fields the schema does not name are dropped), it is a read
when the server marks it `readOnlyHint` and a write otherwise, and a write's idempotency key —
committed before the call — travels in the request's `_meta` under `IDEMPOTENCY_META_KEY` and, over
HTTP, in the `Idempotency-Key` header.

What a call's failure means (`mcp_call`; the table in docs/EXTENDING.md):
- nothing was sent (the server is down or refused the connection): a definite failure — a read is
  retried with backoff, a write fails and is never retried; the credential refused (HTTP 401, 403):
  a definite failure, not retried;
- the server answered with an `isError` result, or a JSON-RPC error saying the request itself was
  wrong (-32600, -32601, -32602): a definite failure, with the server's words;
- after the request was sent, a timeout, a dropped connection, any other JSON-RPC error or an
  answer that is not valid MCP content: a read is retried; a write's outcome is `unknown` —
  reconciliation asks the server's reconciler tool by key, or an operator decides.
"""

import json
import os
from decimal import Decimal
from typing import Any

import anyio
import httpx2
import jsonschema
from django.conf import settings
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from config.secrets import secret_open
from config.threads import off_the_event_loop
from tools_app.models import McpServer, McpTransport, ToolEffect
from tools_app.registry import ApprovalRequirement, Reconciled, Tool, ToolContext, ToolError, ToolOutcomeUnknown

# Where a write's idempotency key travels in a `tools/call` request's `_meta` (a namespaced key, as
# the protocol asks), and the HTTP header that carries it too.
IDEMPOTENCY_META_KEY = "dev.warden/idempotency-key"
IDEMPOTENCY_HEADER = "Idempotency-Key"
# The argument a reconciler tool is called with.
RECONCILER_ARGUMENT = "idempotency_key"
# JSON-RPC errors that say the request itself was refused (so nothing was done): invalid request,
# method not found, invalid params.
_REFUSED_CODES = {-32600, -32601, -32602}
# How much longer than an MCP tool's timeout the barrier waits for the call to give up on its own.
_GIVE_UP_GRACE = 2.0
# What the SDK's client raises when its own read timeout passes (no answer, not the server's error).
_SDK_TIMEOUT_CODE = -32001
# What a tool's options in an agent definition may set (agents.definitions checks them).
TOOL_OPTIONS = ("effect", "approval", "timeout", "reconciler", "business_key", "amount", "currency",
                "currency_argument", "counterparty", "reference", "summary", "max_attempts")


class McpUnavailable(Exception):
    """Listing a server's tools failed; the message says why, in words for the person saving an agent."""


# --- a snapshot's arguments: the server's JSON schema --------------------------------------------

class McpArguments(BaseModel):
    """Arguments checked against an MCP tool's input schema (a subclass per tool sets `_schema`):
    fields the schema does not name are dropped, and a call that does not satisfy the schema raises
    pydantic's ValidationError, as a native tool's arguments do — so a model step that asks for it
    is discarded and nothing is sent."""

    model_config = ConfigDict(extra="allow")
    _schema: dict = {}
    _validator = None  # the schema's validator, made once per tool (`_arguments_class`)

    @classmethod
    def model_validate(cls, obj: Any, *args, **kwargs) -> "McpArguments":
        if not isinstance(obj, dict):
            raise ValidationError.from_exception_data(cls.__name__, [InitErrorDetails(
                type=PydanticCustomError("mcp_schema", "arguments must be a JSON object"), loc=(), input=obj)])
        schema = cls._schema
        properties = schema.get("properties")
        if isinstance(properties, dict) and schema.get("additionalProperties") is not True:
            obj = {key: value for key, value in obj.items() if key in properties}
        errors = sorted(cls._validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, [InitErrorDetails(
                type=PydanticCustomError("mcp_schema", "{reason}", {"reason": error.message[:300]}),
                loc=tuple(error.absolute_path) or (_missing_field(error) or "(root)",), input=error.instance,
            ) for error in errors[:10]])
        return cls.model_construct(**obj)

    @classmethod
    def model_json_schema(cls, *args, **kwargs) -> dict:
        return cls._schema

    @classmethod
    def described_fields(cls) -> dict[str, str]:
        properties = cls._schema.get("properties")
        if not isinstance(properties, dict):
            return {}
        return {name: str((spec or {}).get("description") or "") if isinstance(spec, dict) else ""
                for name, spec in properties.items()}

    def model_dump(self, *args, **kwargs) -> dict:
        return dict(self.__pydantic_extra__ or {})


def _missing_field(error) -> str:
    if error.validator == "required" and isinstance(error.message, str) and error.message.startswith("'"):
        return error.message.split("'")[1]
    return ""


def mcp_schema_problem(schema: Any) -> str:
    """Why `schema` cannot be a tool's input schema ("" when it can): a JSON object schema, valid."""
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return "its input schema is not a JSON object schema"
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
    except jsonschema.SchemaError as error:
        return f"its input schema is not valid JSON Schema: {error.message[:200]}"
    return ""


def _arguments_class(name: str, schema: dict) -> type[McpArguments]:
    cls = type(f"McpArguments_{name}", (McpArguments,), {"__module__": __name__})
    validating = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls._schema, cls._validator = schema, validating(schema, format_checker=validating.FORMAT_CHECKER)
    return cls


# --- talking to a server -----------------------------------------------------------------------

def _server_read(name: str) -> McpServer:
    """The server row, read on every call: a rotated credential applies to the next call."""
    server = McpServer.objects.filter(name=name).first()
    if server is None:
        raise ToolError("mcp_server_missing", f"MCP server {name!r} is no longer defined; nothing was sent")
    return server


def _secret_of(server: McpServer) -> dict[str, str]:
    if not server.credential:
        return {}
    value = json.loads(secret_open(server.credential))
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _client(server: McpServer, *, extra_headers: dict[str, str], timeout: float, statuses: list[int]):
    """The SDK's client for one conversation with the server; `statuses` collects the HTTP statuses it
    sees (the SDK reports a refused credential only as a JSON-RPC error without the status)."""
    from mcp import Client, StdioServerParameters  # imported here: only processes that call MCP servers pay for it

    if server.transport == McpTransport.STDIO:
        if not settings.WARDEN_MCP_STDIO:
            raise ToolError("mcp_stdio_not_allowed", f"MCP server {server.name} is a local command, and this "
                            "deployment does not allow those (WARDEN_MCP_STDIO); nothing was sent")
        command = list(server.command or [])
        env = {"PATH": os.environ.get("PATH", ""), **_secret_of(server)}
        return Client(StdioServerParameters(command=command[0], args=command[1:], env=env), read_timeout_seconds=timeout,
                      cache=None), None
    from mcp.client.streamable_http import streamable_http_client

    async def seen(response) -> None:
        statuses.append(response.status_code)

    http = httpx2.AsyncClient(headers={**_secret_of(server), **extra_headers}, event_hooks={"response": [seen]},
                              timeout=httpx2.Timeout(timeout, connect=min(timeout, 10.0)))
    return Client(streamable_http_client(server.url, http_client=http), read_timeout_seconds=timeout, cache=None), http


def _run(coroutine_function, *args):
    """Run the SDK's coroutine to its end from synchronous code (off an event loop this thread may run)."""
    return off_the_event_loop(anyio.run, coroutine_function, *args)


def mcp_tools_list(server: McpServer, *, timeout: float | None = None) -> list[dict]:
    """The server's tools as it describes them now: name, description, input schema, annotations."""
    timeout = timeout or server.timeout_seconds
    statuses: list[int] = []

    async def listing() -> list[dict]:
        client, http = _client(server, extra_headers={}, timeout=timeout, statuses=statuses)
        try:
            with anyio.fail_after(timeout):
                async with client:
                    tools, cursor = [], None
                    while True:
                        page = await client.list_tools(cursor=cursor, cache_mode="refresh") if cursor else \
                            await client.list_tools(cache_mode="refresh")
                        tools.extend(page.tools)
                        cursor = page.next_cursor
                        if not cursor:
                            break
        finally:
            if http is not None:
                await http.aclose()
        return [_tool_description(tool) for tool in tools]

    try:
        return _run(listing)
    except ToolError as error:
        raise McpUnavailable(error.detail) from None
    except TimeoutError:
        raise McpUnavailable(f"MCP server {server.name} did not list its tools within {timeout:g} s") from None
    except Exception as error:  # noqa: BLE001 - any failure to list is said in words, never half-saved
        if refused := _credential_refused(statuses):
            raise McpUnavailable(f"MCP server {server.name} refused Warden's credential ({refused}): check the "
                                 "server's credential on the desk") from None
        raise McpUnavailable(f"could not list the tools of MCP server {server.name}: {_words(error)}") from None


def _tool_description(tool) -> dict:
    annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else {}
    return {"name": tool.name, "description": tool.description or "", "input_schema": tool.input_schema,
            "annotations": annotations}


def _words(error: BaseException) -> str:
    """An exception in words (never a credential: those travel in headers, which no error repeats)."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(_words(e) for e in error.exceptions[:3])
    if isinstance(error, httpx2.HTTPStatusError):
        return f"HTTP {error.response.status_code} from the server"
    text = str(error) or type(error).__name__
    return f"{type(error).__name__}: {text}"[:500]


def _credential_refused(statuses: list[int]) -> str:
    refused = [status for status in statuses if status in (401, 403)]
    return f"HTTP {refused[0]}" if refused else ""


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def mcp_call(*, server_name: str, tool: str, arguments: dict, idempotency_key: str | None, timeout: float,
             write: bool) -> dict:
    """Call `tool` on the server and return its result as a JSON object, or raise what the barrier
    understands: ToolError (definite: nothing was done, or the server said it failed) or, for a
    write whose request left, ToolOutcomeUnknown."""
    from mcp.shared.exceptions import MCPError

    server = _server_read(server_name)
    headers = {IDEMPOTENCY_HEADER: idempotency_key} if idempotency_key else {}
    meta = {IDEMPOTENCY_META_KEY: idempotency_key} if idempotency_key else None
    sent = False
    statuses: list[int] = []

    async def calling():
        nonlocal sent
        client, http = _client(server, extra_headers=headers, timeout=timeout, statuses=statuses)
        try:
            with anyio.fail_after(timeout):
                async with client:
                    sent = True
                    return await client.call_tool(tool, arguments, meta=meta)
        finally:
            if http is not None:
                with anyio.CancelScope(shield=True):
                    await http.aclose()

    where = f"MCP server {server_name}"
    try:
        result = _run(calling)
    except ToolError:
        raise
    except TimeoutError:
        if sent:
            _unknown_or_retry(write, f"{where} gave no answer to {tool} within {timeout:g} s")
        raise ToolError("mcp_unavailable", f"{where} could not be reached within {timeout:g} s; nothing was sent",
                        retryable=True) from None
    except BaseException as error:  # noqa: BLE001 - sorted below into what the barrier understands
        leaves = _leaves(error)
        jsonrpc = next((leaf for leaf in leaves if isinstance(leaf, MCPError)), None)
        if not isinstance(error, Exception) and jsonrpc is None:
            raise
        if refused := _credential_refused(statuses):
            # Refused at the door (the SDK says only "error response"): the call was not carried out.
            raise ToolError("mcp_unauthorized", f"{where} refused Warden's credential ({refused}); nothing was "
                            "done — check the server's credential on the desk") from None
        if not sent or any(isinstance(leaf, httpx2.ConnectError) for leaf in leaves):
            raise ToolError("mcp_unavailable", f"{where} could not be reached ({_words(error)}); nothing was sent",
                            retryable=True) from None
        if jsonrpc is not None and jsonrpc.code in _REFUSED_CODES:
            raise ToolError("mcp_refused", f"{where} refused the call to {tool}: {jsonrpc.message} "
                            f"(JSON-RPC error {jsonrpc.code}); nothing was done") from None
        if jsonrpc is not None and jsonrpc.code == _SDK_TIMEOUT_CODE:
            _unknown_or_retry(write, f"{where} gave no answer to {tool} within {timeout:g} s")
        if jsonrpc is not None:
            _unknown_or_retry(write, f"{where} answered {tool} with an error, which does not say whether it acted: "
                                     f"{jsonrpc.message} (JSON-RPC error {jsonrpc.code})")
        if any(isinstance(leaf, ValidationError) for leaf in leaves):
            _unknown_or_retry(write, f"{where} answered {tool} with something that is not valid MCP content")
        _unknown_or_retry(write, f"the connection to {where} failed while {tool} was in flight ({_words(error)})")
    if result.is_error:
        raise ToolError("mcp_tool_error", f"{where}: {tool} failed: {_content_text(result) or 'no reason given'}")
    return _result_of(result)


def _unknown_or_retry(write: bool, detail: str):
    if write:
        raise ToolOutcomeUnknown(detail)
    raise ToolError("mcp_failed", detail, retryable=True)


def _content_text(result) -> str:
    texts = [block.text for block in result.content or [] if getattr(block, "type", "") == "text"]
    return " ".join(" ".join(texts).split())[:1000]


def _result_of(result) -> dict:
    """A call's result as the tool call keeps it: the structured content when the server gave an
    object, else the text (as JSON when it is a JSON object)."""
    if isinstance(result.structured_content, dict):
        return result.structured_content
    if result.structured_content is not None:
        return {"result": result.structured_content}
    text = _content_text(result)
    try:
        parsed = json.loads(text) if text else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    return {"text": text}


# --- snapshots: what a version keeps of a server's tools ------------------------------------------

def mcp_effect(entry: dict) -> str:
    """Read only when the server marks the tool `readOnlyHint` (or the agent says so); anything else writes."""
    options = entry.get("options") or {}
    if options.get("effect") in ToolEffect.values:
        return options["effect"]
    return ToolEffect.READ if (entry.get("annotations") or {}).get("readOnlyHint") is True else ToolEffect.WRITE


def mcp_default_approval(entry: dict) -> str:
    """A write the server calls destructive (the protocol's default for a tool that is not read-only)
    waits for an operator unless the agent's rules say otherwise; a write it calls non-destructive
    runs unasked unless a rule asks."""
    options = entry.get("options") or {}
    if options.get("approval") in (ApprovalRequirement.NONE, ApprovalRequirement.USER, ApprovalRequirement.OPERATOR):
        return options["approval"]
    if mcp_effect(entry) == ToolEffect.READ:
        return ApprovalRequirement.NONE
    destructive = (entry.get("annotations") or {}).get("destructiveHint")
    return ApprovalRequirement.NONE if destructive is False else ApprovalRequirement.OPERATOR


def mcp_tool_build(name: str, entry: dict) -> Tool:
    """A registry Tool from a snapshot entry (AgentVersion.mcp_tools[name])."""
    options = entry.get("options") or {}
    schema = entry.get("input_schema") or {"type": "object"}
    effect = mcp_effect(entry)
    server_name, remote = entry["server"], entry.get("tool", name)
    timeout = float(options.get("timeout") or entry.get("timeout") or 30.0)
    write = effect == ToolEffect.WRITE

    def execute(ctx: ToolContext, arguments: McpArguments) -> dict:
        return mcp_call(server_name=server_name, tool=remote, arguments=arguments.model_dump(),
                        idempotency_key=ctx.idempotency_key if write else None, timeout=timeout, write=write)

    reconcile = None
    if write and options.get("reconciler"):
        reconciler = options["reconciler"]

        def reconcile(ctx: ToolContext, arguments: McpArguments) -> Reconciled | None:
            answer = mcp_call(server_name=server_name, tool=reconciler, arguments={RECONCILER_ARGUMENT: ctx.idempotency_key},
                              idempotency_key=None, timeout=timeout, write=False)
            if not isinstance(answer.get("applied"), bool):
                return None  # the reconciler cannot tell (yet): asked again later, then a person decides
            result = answer.get("result")
            return Reconciled(applied=answer["applied"], result=result if isinstance(result, dict) else None,
                              detail=f"{reconciler} on MCP server {server_name}")

    business_key = None
    if write and options.get("business_key"):
        fields = options["business_key"]
        fields = [fields] if isinstance(fields, str) else list(fields)

        def business_key(arguments: McpArguments) -> str:
            values = arguments.model_dump()
            return ":".join(_key_part(values.get(field)) for field in fields)

    return Tool(
        name=name, description=entry.get("description") or name, arguments=_arguments_class(name, schema), effect=effect,
        # The call gives up at `timeout` itself, saying which server; the barrier's own bound
        # (engine.tool_exec) is a moment later, for a call that hangs even in giving up.
        execute=execute, approval=mcp_default_approval(entry), timeout=timeout + _GIVE_UP_GRACE,
        max_attempts=int(options.get("max_attempts") or 3), reconcile=reconcile, business_key=business_key,
        amount=options.get("amount"), currency=options.get("currency"), currency_argument=options.get("currency_argument"),
        counterparty=options.get("counterparty"), reference=options.get("reference"), summary=options.get("summary"),
        extra={"mcp_server": server_name, "mcp_tool": remote},
    )


def _key_part(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if isinstance(value, float):
        return str(Decimal(str(value)).normalize())
    return "" if value is None else str(value).strip()


def mcp_tool_properties(entry: dict) -> tuple[str, ...]:
    properties = (entry.get("input_schema") or {}).get("properties")
    return tuple(properties) if isinstance(properties, dict) else ()
