import uuid

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import Q

from config.row_rules import RowRules


class ToolEffect(models.TextChoices):
    READ = "read"
    WRITE = "write"


class ToolCallStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    # The request may or may not have taken effect downstream (timeout after sending):
    # only reconciliation, automatic or by an operator, may resolve it.
    UNKNOWN = "unknown"
    CANCELLED = "cancelled"


FINAL_TOOL_CALL_STATUSES = (ToolCallStatus.SUCCEEDED, ToolCallStatus.FAILED, ToolCallStatus.CANCELLED)


class Resolution(models.TextChoices):
    APPLIED = "applied"
    NOT_APPLIED = "not_applied"


# A tool call row is written twice in every tool step (config/row_rules.py).
TOOL_CALL_ROW_RULES = RowRules(
    table="tools_app_toolcall", function="warden_tool_call_row_valid", name="tool_call_row_valid", rules=(
        ("tool_call_effect_valid", Q(effect__in=ToolEffect.values)),
        ("tool_call_status_valid", Q(status__in=ToolCallStatus.values)),
        ("tool_call_resolution_valid", Q(resolution="") | Q(resolution__in=Resolution.values)),
        # A write that ran (or may have run) always has its key: it was committed before I/O.
        ("tool_call_write_keyed_before_io", ~(
            Q(effect=ToolEffect.WRITE)
            & Q(status__in=[ToolCallStatus.RUNNING, ToolCallStatus.UNKNOWN])
            & Q(idempotency_key__isnull=True)
        )),
        # Only writes can be `unknown`: reads are simply retried.
        ("tool_call_unknown_only_for_writes", ~Q(status=ToolCallStatus.UNKNOWN) | Q(effect=ToolEffect.WRITE)),
        ("tool_call_finished_when_final", ~Q(status__in=FINAL_TOOL_CALL_STATUSES) | Q(finished_at__isnull=False)),
    ),
)


class ToolCall(models.Model):
    """One tool invocation the model asked for, with its own lifecycle (SPEC §6)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey("runs_app.Run", on_delete=models.PROTECT, related_name="tool_calls")
    # db_index=False: the unique (step, index) index serves lookups by step (one index less per write).
    step = models.ForeignKey("runs_app.Step", on_delete=models.PROTECT, related_name="tool_calls", db_index=False)
    index = models.PositiveIntegerField(default=0)  # position in the model's turn
    tool_call_id = models.CharField(max_length=128)  # the model's id; never used as a business key
    tool_name = models.CharField(max_length=100)
    arguments = models.JSONField(default=dict)
    # What the model asked, when an operator changed the arguments before approving (SPEC §18);
    # null otherwise. `arguments` is then what executes.
    proposed_arguments = models.JSONField(null=True, blank=True)
    effect = models.CharField(max_length=8, choices=ToolEffect.choices)
    status = models.CharField(max_length=12, choices=ToolCallStatus.choices, default=ToolCallStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    # Business idempotency key for writes, committed before the first network call and sent
    # downstream. A repeated request for the same action points at the original call instead.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    # A write's business key (Tool.business_key_for): the same on every call asking for the same
    # business fact, in any run or session — the original, its retries and the calls answered
    # from it (reused_from). Under it, one call at a time holds the idempotency key.
    business_key = models.CharField(max_length=200, null=True, blank=True, db_index=False)
    # What the run-time's guards decided when the call was created (agents.limits), for a write:
    # {"refused": {"code", "detail"}} (a write cap or a limit refuses it: it never runs), or the
    # limits' windows with this call in them, {"totals": […], "over": [...], "approval", "approvers"}.
    guard = models.JSONField(null=True, blank=True)
    # db_index=False, and for resolved_by too: almost every call has none, so a partial index
    # (Meta.indexes) serves the look-ups without an entry for each call written.
    reused_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="reused_by", db_index=False
    )
    result = models.JSONField(null=True, blank=True)
    error_code = models.CharField(max_length=40, blank=True)
    error_detail = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)  # read retries and reconciliation
    # The lease under which the call was last marked running: a running call under an older
    # token was interrupted by a crash (SPEC §10).
    lease_token = models.BigIntegerField(default=0)

    # Resolution of an `unknown` call: by the reconcile job (resolved_by null) or an operator.
    reconcile_attempts = models.PositiveIntegerField(default=0)
    resolution = models.CharField(max_length=12, choices=Resolution.choices, blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    resolved_at = models.DateTimeField(null=True, blank=True)
    evidence = models.TextField(blank=True)

    class Meta:
        ordering = ["run", "step", "index"]
        permissions = [("reconcile_toolcall", "Can record the outcome of unknown tool calls")]
        constraints = [
            TOOL_CALL_ROW_RULES.constraint(),
            models.UniqueConstraint(
                fields=["idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="tool_call_idempotency_key_unique",
            ),
            models.UniqueConstraint(fields=["step", "index"], name="tool_call_step_index_unique"),
        ]
        indexes = [
            models.Index(fields=["status", "created_at"], name="tool_call_status_recent"),
            # The desk's search by business key: any argument's value (jsonb_ops answers `@?`).
            GinIndex(fields=["arguments"], name="tool_call_arguments_search"),
            # The desk's list of tool calls, newest first.
            models.Index(fields=["-created_at", "-id"], name="tool_call_recent"),
            models.Index(fields=["reused_from"], condition=Q(reused_from__isnull=False), name="tool_call_reused_from"),
            models.Index(fields=["business_key", "created_at"], condition=Q(business_key__isnull=False),
                         name="tool_call_business_key"),
            models.Index(fields=["resolved_by"], condition=Q(resolved_by__isnull=False), name="tool_call_resolved_by"),
            # The API's runs by tool (`GET /runs?tool=`): the runs that called it, from the index alone.
            models.Index(fields=["tool_name", "run"], name="tool_call_tool_run"),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} ({self.status})"


class UnknownToolCall(ToolCall):
    """The operators' unknown-calls queue (SPEC §6, §13): the same rows as ToolCall, shown in
    the admin as their own list of `unknown` writes waiting for reconciliation."""

    class Meta:
        proxy = True
        ordering = ["created_at"]
        verbose_name = "unknown tool call"


class McpTransport(models.TextChoices):
    HTTP = "http", "Streamable HTTP"
    STDIO = "stdio", "A local command over stdio"


class McpServer(models.Model):
    """A Model Context Protocol server whose tools an agent version may use (docs/EXTENDING.md, "MCP
    servers"): where it is and the credential it wants. A version snapshots the tools it chose
    (AgentVersion.mcp_tools), so the server changing them changes no run; `tools_seen` is what the
    server listed when last checked, which the desk compares with the agents' snapshots. Changed
    through engine.actions.mcp_servers only."""

    id = models.BigAutoField(primary_key=True)
    name = models.SlugField(max_length=64, unique=True, help_text="Agent definitions name the server by it.")
    transport = models.CharField(max_length=8, choices=McpTransport.choices, default=McpTransport.HTTP)
    url = models.URLField(max_length=300, blank=True, default="",
                          help_text="Streamable HTTP only: the server's MCP endpoint, e.g. https://mcp.example.com/mcp.")
    # Stdio only, and only where WARDEN_MCP_STDIO is on: the command and its arguments.
    command = models.JSONField(default=list, blank=True)
    # Sealed (config.secrets): a JSON object of HTTP headers (e.g. Authorization) or, for stdio,
    # environment variables. Never shown, logged or traced; sent only to the server itself.
    credential = models.TextField(blank=True, default="", editable=False)
    timeout_seconds = models.FloatField(default=30.0, help_text="The most a call may take, unless the agent sets a tool's own.")
    tools_seen = models.JSONField(default=list, blank=True, editable=False)
    tools_checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    check_error = models.TextField(blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"
        constraints = [
            models.CheckConstraint(condition=Q(transport__in=McpTransport.values), name="mcp_server_transport_valid"),
            models.CheckConstraint(condition=(Q(transport=McpTransport.HTTP) & ~Q(url=""))
                                   | (Q(transport=McpTransport.STDIO) & Q(url="")),
                                   name="mcp_server_url_iff_http"),
            models.CheckConstraint(condition=Q(timeout_seconds__gt=0), name="mcp_server_timeout_positive"),
        ]

    def __str__(self) -> str:
        return self.name
