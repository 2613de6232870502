import uuid

from django.conf import settings
from django.db import models
from django.db.models import Func, Q
from django.db.models.functions import Cast

from config.row_rules import RowRules


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)
ACTIVE_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING)


class RunPhase(models.TextChoices):
    WAITING_WORKER = "waiting_worker"
    PREPARING_CONTEXT = "preparing_context"
    CALLING_MODEL = "calling_model"
    EXECUTING_TOOLS = "executing_tools"


RUNNING_PHASES = (RunPhase.PREPARING_CONTEXT, RunPhase.CALLING_MODEL, RunPhase.EXECUTING_TOOLS)


class WaitReason(models.TextChoices):
    WAITING_INPUT = "waiting_input"
    APPROVAL = "approval"
    RETRY_BACKOFF = "retry_backoff"
    RECONCILIATION = "reconciliation"
    # A write of a frozen agent, tool or customer waits for an operator to lift the freeze (SPEC §18).
    FROZEN = "frozen"


# Waits that end when a person acts (or their own clock runs out): they do not use up the run's
# execution deadline (SPEC §16). A backoff is the run's own time.
DEADLINE_PAUSED_WAITS = (WaitReason.APPROVAL, WaitReason.WAITING_INPUT, WaitReason.RECONCILIATION, WaitReason.FROZEN)


class RunOutcome(models.TextChoices):
    """What a run's writes came to, beside the status (which measures the execution): a refund
    politely refused is a `completed` run whose outcome is `rejected`. Set once, when the run
    ends (engine.actions.runs.run_end); blank while the run is active."""

    APPLIED = "applied", "Effects applied"
    NOT_APPLIED = "not_applied", "Not applied"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    NONE = "none", "No write asked for"


# The outcomes of runs whose write did not happen: what an operator looks for after an incident.
NOT_TAKEN_EFFECT = (RunOutcome.NOT_APPLIED, RunOutcome.REJECTED, RunOutcome.EXPIRED)


class RunErrorCode(models.TextChoices):
    MODEL_CALL_BUDGET = "budget_model_calls", "Model call budget exhausted"
    TOKEN_BUDGET = "budget_tokens", "Token budget exhausted"
    DEADLINE = "deadline_exceeded", "Deadline exceeded"
    MODEL_RETRIES = "model_retries_exhausted", "Transient model errors exceeded the retry limit"
    MODEL_ERROR = "model_error", "The model provider returned a permanent error"
    INVALID_OUTPUT = "model_output_invalid", "The model kept producing invalid or truncated output"
    OUTPUT_TRUNCATED = "model_output_truncated", "The model's answer did not fit in the largest output limit"
    UNKNOWN_TOOL = "unknown_tool", "The model asked for a tool that is not registered"
    INTERNAL = "internal_error", "Internal error"


def _run_state_rules() -> RowRules:
    """Only legal status × phase × wait-reason combinations can be stored (SPEC §2): the run row's
    rules, checked by one constraint (config/row_rules.py: the run row is written in every step)."""
    no_phase = Q(phase="")
    no_wait = Q(wait_reason="")
    leased = Q(lease_owner__gt="") & Q(lease_expires_at__isnull=False)
    unleased = Q(lease_owner="") & Q(lease_expires_at__isnull=True)
    return RowRules(table="runs_app_run", function="warden_run_row_valid", name="run_row_valid", rules=(
        ("run_status_valid", Q(status__in=RunStatus.values)),
        ("run_phase_valid", no_phase | Q(phase__in=RunPhase.values)),
        ("run_wait_reason_valid", no_wait | Q(wait_reason__in=WaitReason.values)),
        ("run_queued_shape", ~Q(status=RunStatus.QUEUED) | (Q(phase=RunPhase.WAITING_WORKER) & no_wait & unleased)),
        # A running run is held by exactly one worker, in a working phase.
        ("run_running_shape", ~Q(status=RunStatus.RUNNING) | (Q(phase__in=RUNNING_PHASES) & no_wait & leased)),
        ("run_waiting_shape", ~Q(status=RunStatus.WAITING) | (no_phase & ~no_wait & unleased)),
        ("run_terminal_shape",
         ~Q(status__in=TERMINAL_STATUSES) | (no_phase & no_wait & unleased & Q(finished_at__isnull=False))),
        ("run_finished_only_when_terminal", Q(status__in=TERMINAL_STATUSES) | Q(finished_at__isnull=True)),
        ("run_failed_has_error_code", ~Q(status=RunStatus.FAILED) | ~Q(error_code="")),
        ("run_outcome_valid", Q(outcome="") | Q(outcome__in=RunOutcome.values)),
        ("run_outcome_only_when_ended", Q(status__in=TERMINAL_STATUSES) | Q(outcome="")),
        ("run_lease_token_non_negative", Q(lease_token__gte=0)),
        ("run_usage_non_negative", Q(model_calls__gte=0) & Q(tokens_used__gte=0)),
    ))


RUN_ROW_RULES = _run_state_rules()


class Run(models.Model):
    """One execution pursuing one user request. Its checkpoint is this row plus its steps,
    tool calls and the session's history (SPEC §4)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey("sessions_app.Session", on_delete=models.PROTECT, related_name="runs")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    phase = models.CharField(max_length=24, choices=RunPhase.choices, blank=True, default=RunPhase.WAITING_WORKER)
    wait_reason = models.CharField(max_length=24, choices=WaitReason.choices, blank=True)

    # Wait context: what the run waits for and what wakes it.
    wait_type = models.CharField(max_length=32, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    resume_target = models.CharField(max_length=64, blank=True)

    # The agent version the run was started with (null: a run from before agents, or of a
    # session without one — every registered tool, each tool's own approval policy).
    agent_version = models.ForeignKey(
        "agents.AgentVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="runs"
    )

    # Budgets and usage.
    provider = models.CharField(max_length=32, default="scripted")
    # Per-run provider settings; the scripted provider reads its test faults from here.
    provider_options = models.JSONField(default=dict, blank=True)
    max_model_calls = models.PositiveIntegerField()
    model_calls = models.PositiveIntegerField(default=0)
    max_tokens = models.PositiveIntegerField()
    tokens_used = models.PositiveIntegerField(default=0)
    deadline = models.DateTimeField()
    model_retries = models.PositiveIntegerField(default=0)
    # Consecutive model outputs the run rejected (reset by an accepted one): repeated invalid
    # output backs off, then fails early instead of burning the call budget.
    invalid_outputs = models.PositiveIntegerField(default=0)
    # The max_tokens the next model call asks for once a length cut made the run ask for more;
    # 0: the provider options' or WARDEN_MODEL_MAX_OUTPUT_TOKENS.
    max_output_tokens = models.PositiveIntegerField(default=0)
    # When the current wait began: time spent waiting for a person is added back to the deadline.
    wait_started_at = models.DateTimeField(null=True, blank=True)
    # A failed or cancelled run retried from its checkpoint as this new run (SPEC §16).
    retry_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="retries")
    # An ended run forked as this new run, in a new session of the same customer, from the input
    # that started it (SPEC §18): its business keys answer the fork's requests, never book twice.
    forked_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="forks")
    # Who chose this run's budgets (in their request); null: the deployment's defaults. Requests
    # are capped (settings.WARDEN_*_CAP) unless the requester may exceed the caps.
    budgets_set_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    # Lease: who drives the run. lease_token only ever increases; every write a worker makes
    # is conditional on it, so a worker that stalled past its lease cannot write again.
    lease_owner = models.CharField(max_length=128, blank=True)
    lease_token = models.BigIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    cancel_reason = models.CharField(max_length=300, blank=True)

    error_code = models.CharField(max_length=40, blank=True)
    error_detail = models.TextField(blank=True)
    outcome = models.CharField(max_length=12, choices=RunOutcome.choices, blank=True)

    # Bumped by every checkpoint; the highest RunEvent.seq handed out (gap-free per run).
    snapshot_version = models.PositiveBigIntegerField(default=0)
    event_seq = models.PositiveBigIntegerField(default=0)
    step_count = models.PositiveIntegerField(default=0)

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [
            ("exceed_budget_caps", "Can set a run's budgets above the configured caps"),
            ("follow_all_events", "Can follow the account-wide event stream"),
        ]
        constraints = [
            RUN_ROW_RULES.constraint(),
            # At most one non-terminal run per session, whatever the code does.
            models.UniqueConstraint(
                fields=["session"],
                condition=Q(status__in=ACTIVE_STATUSES),
                name="run_one_active_per_session",
            ),
        ]
        indexes = [
            models.Index(fields=["-created_at", "-id"], name="run_recent"),
            models.Index(fields=["status", "-created_at", "-id"], name="run_status_recent"),
            models.Index(fields=["session", "-created_at"], name="run_session_recent"),
            models.Index(fields=["outcome", "-created_at", "-id"], name="run_outcome_recent"),
            models.Index(fields=["lease_expires_at"], condition=Q(status=RunStatus.RUNNING), name="run_lease_due"),
            models.Index(fields=["expires_at"], condition=Q(status=RunStatus.WAITING), name="run_wait_due"),
        ]

    def __str__(self) -> str:
        return f"Run {self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class StepKind(models.TextChoices):
    MODEL = "model"
    TOOLS = "tools"


class StepStatus(models.TextChoices):
    RUNNING = "running"
    COMPLETED = "completed"
    # The model's output was rejected (truncated, malformed) or abandoned (crash, cancel);
    # nothing it proposed was executed.
    DISCARDED = "discarded"
    FAILED = "failed"


# A step row is written twice in every step (config/row_rules.py).
STEP_ROW_RULES = RowRules(table="runs_app_step", function="warden_step_row_valid", name="step_row_valid", rules=(
    ("step_kind_valid", Q(kind__in=StepKind.values)),
    ("step_status_valid", Q(status__in=StepStatus.values)),
    ("step_finished_when_done", Q(status=StepStatus.RUNNING) | Q(finished_at__isnull=False)),
))


class Step(models.Model):
    """One model call or one batch of tool calls of a run."""

    id = models.BigAutoField(primary_key=True)
    # db_index=False: the unique (run, index) index serves lookups by run (one index less per insert).
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="steps", db_index=False)
    index = models.PositiveIntegerField()
    kind = models.CharField(max_length=8, choices=StepKind.choices)
    status = models.CharField(max_length=12, choices=StepStatus.choices, default=StepStatus.RUNNING)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    finish_reason = models.CharField(max_length=32, blank=True)
    # A model step: the endpoint and model that answered it (a fallback's when the primary failed;
    # blank: the deployment's default endpoint or a provider without endpoints) and what the call
    # cost from that model's prices, in WARDEN_COST_CURRENCY (null: no prices known).
    endpoint = models.CharField(max_length=64, blank=True, default="")
    model = models.CharField(max_length=100, blank=True, default="")
    cost = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    # Which history messages (by seq) the model saw, and any summary it saw instead of older ones.
    context_manifest = models.JSONField(default=dict, blank=True)
    discard_reason = models.CharField(max_length=300, blank=True)
    # Text streamed so far: saved by the heartbeat while streaming, final at completion, so a
    # console joining mid-stream can show what was already said.
    streamed_text = models.TextField(blank=True)
    lease_token = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["run", "index"]
        constraints = [
            models.UniqueConstraint(fields=["run", "index"], name="step_run_index_unique"),
            STEP_ROW_RULES.constraint(),
        ]

    def __str__(self) -> str:
        return f"Step {self.index} ({self.kind}, {self.status})"


class RunEvent(models.Model):
    """The ordered, persisted log of a run's lifecycle; consoles catch up from it by seq."""

    id = models.BigAutoField(primary_key=True)
    # db_index=False: the unique (run, seq) index serves lookups by run (one index less per insert).
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="events", db_index=False)
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=40)
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The id of the transaction that wrote the event (pg_current_xact_id), set by the database on
    # every insert, raw or not: with the row's id it orders the events of many runs as they were
    # committed, for the session and account streams (runs_app.feeds).
    xact_id = models.BigIntegerField(db_default=Cast(Cast(Func(function="pg_current_xact_id", output_field=models.TextField()),
                                                           models.TextField()), models.BigIntegerField()))

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="run_event_run_seq_unique"),
            models.CheckConstraint(condition=Q(seq__gte=1), name="run_event_seq_positive"),
        ]
        indexes = [models.Index(fields=["xact_id", "id"], name="run_event_commit_order")]

    def __str__(self) -> str:
        return f"{self.seq} {self.type}"


class ContextSummary(models.Model):
    """A summary of older history, stored beside it (never replacing it) and used to build
    model context once the history outgrows the token window."""

    id = models.BigAutoField(primary_key=True)
    session = models.ForeignKey("sessions_app.Session", on_delete=models.PROTECT, related_name="summaries")
    covers_through_seq = models.PositiveIntegerField()
    content = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session", "-covers_through_seq"]
        constraints = [
            models.UniqueConstraint(fields=["session", "covers_through_seq"], name="summary_session_seq_unique")
        ]


class EndpointKind(models.TextChoices):
    """The wire protocol a model endpoint speaks, and so the provider that calls it
    (runs_app.endpoints.ENDPOINT_PROVIDERS); `custom`: the provider the endpoint names itself, one of
    the deployment's WARDEN_PROVIDERS."""

    CHAT_COMPLETIONS = "chat_completions", "OpenAI-compatible Chat Completions"
    RESPONSES = "responses", "OpenAI Responses"
    ANTHROPIC_MESSAGES = "anthropic_messages", "Anthropic Messages"
    CUSTOM = "custom", "A deployment's own provider"


class ModelEndpoint(models.Model):
    """A model server an agent version may name (docs/EXTENDING.md, "Model endpoints"): where it is,
    the credential it wants, the models it offers and how hard it may be pushed. Workers read the
    row on every model call (runs_app.endpoints.endpoint_read), so an edit — a rotated key — applies
    to the next call without a restart. Changed through engine.actions.endpoints.endpoint_save only."""

    id = models.BigAutoField(primary_key=True)
    name = models.SlugField(max_length=64, unique=True, help_text="Agent definitions name the endpoint by it.")
    kind = models.CharField(max_length=32, choices=EndpointKind.choices, default=EndpointKind.CHAT_COMPLETIONS)
    base_url = models.URLField(max_length=300, help_text="e.g. https://api.openai.com/v1 (…/chat/completions is added).")
    # Kind `custom` only: the name of the deployment's provider (a key of WARDEN_PROVIDERS) that calls it.
    provider = models.CharField(max_length=64, blank=True, default="",
                                help_text="Kind “a deployment's own provider” only: its name in WARDEN_PROVIDERS.")
    # Sealed (config.secrets): never shown, logged or sent anywhere but to the endpoint itself.
    credential = models.TextField(blank=True, default="", editable=False)
    # Model calls one worker process has in flight to this endpoint at once; null: the deployment's
    # WARDEN_MODEL_CONCURRENCY_PER_ENDPOINT.
    max_concurrency = models.PositiveIntegerField(null=True, blank=True)
    timeout_seconds = models.FloatField(default=60.0, help_text="The most a call may take to answer (each read of its stream).")
    connect_timeout_seconds = models.FloatField(default=10.0, help_text="The most opening a connection may take.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(max_concurrency__isnull=True) | Q(max_concurrency__gte=1),
                                   name="model_endpoint_concurrency_positive"),
            models.CheckConstraint(condition=Q(timeout_seconds__gt=0) & Q(connect_timeout_seconds__gt=0),
                                   name="model_endpoint_timeouts_positive"),
            models.CheckConstraint(condition=Q(kind__in=EndpointKind.values), name="model_endpoint_kind_valid"),
            models.CheckConstraint(condition=(Q(kind=EndpointKind.CUSTOM) & ~Q(provider=""))
                                   | (~Q(kind=EndpointKind.CUSTOM) & Q(provider="")),
                                   name="model_endpoint_provider_iff_custom"),
        ]

    def __str__(self) -> str:
        return self.name


class EndpointModel(models.Model):
    """A model an endpoint offers, with what it costs and how much context it takes."""

    id = models.BigAutoField(primary_key=True)
    endpoint = models.ForeignKey(ModelEndpoint, on_delete=models.CASCADE, related_name="offered_models")
    name = models.CharField(max_length=100, help_text="As the endpoint names it, e.g. gpt-4o-mini.")
    input_price_per_million = models.DecimalField(max_digits=12, decimal_places=4, default=0,
                                                  help_text="Price of a million prompt tokens (WARDEN_COST_CURRENCY).")
    output_price_per_million = models.DecimalField(max_digits=12, decimal_places=4, default=0,
                                                   help_text="Price of a million answer tokens (WARDEN_COST_CURRENCY).")
    context_window = models.PositiveIntegerField(help_text="Tokens the model takes in, prompt and answer together.")

    class Meta:
        ordering = ["endpoint", "name"]
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "name"], name="endpoint_model_name_unique"),
            models.CheckConstraint(condition=Q(input_price_per_million__gte=0) & Q(output_price_per_million__gte=0),
                                   name="endpoint_model_prices_not_negative"),
            models.CheckConstraint(condition=Q(context_window__gte=1), name="endpoint_model_window_positive"),
        ]

    def __str__(self) -> str:
        return self.name
