import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from config.row_rules import RowRules


class Session(models.Model):
    """A long-lived conversation. A run ending never ends its session."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="agent_sessions")
    title = models.CharField(max_length=200, blank=True)
    # The agent its runs use (each run takes the agent's current version when it starts); null:
    # a session from before agents, or a deployment with none configured.
    agent = models.ForeignKey("agents.Agent", null=True, blank=True, on_delete=models.PROTECT, related_name="sessions")
    # Highest Message.seq handed out; appends lock this row, so seqs are gap-free per session.
    message_seq = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["owner", "-created_at"], name="session_owner_recent")]

    def __str__(self) -> str:
        return self.title or f"Session {self.id}"


class RateCounter(models.Model):
    """A rate limit's count of one caller in one fixed window (config/throttling.py), incremented
    atomically; without Redis, every web process counts here. Rows expire two windows on."""

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(max_length=200)
    start = models.BigIntegerField()  # the window's start, epoch seconds
    expires = models.BigIntegerField()
    count = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "warden_rate_counter"
        constraints = [models.UniqueConstraint(fields=["key", "start"], name="rate_counter_key_window")]
        indexes = [models.Index(fields=["expires"], name="rate_counter_expires")]


class MessageRole(models.TextChoices):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


# Messages are appended in every step (config/row_rules.py).
MESSAGE_ROW_RULES = RowRules(
    table="sessions_app_message", function="warden_message_row_valid", name="message_row_valid", rules=(
        ("message_role_valid", Q(role__in=MessageRole.values)),
        ("message_tool_answers_a_call", ~Q(role=MessageRole.TOOL) | ~Q(tool_call_id="")),
    ),
)


class Message(models.Model):
    """One accepted fact of the conversation. Append-only: the database refuses UPDATE and
    DELETE on this table (trigger in migration 0002), so history can never be rewritten."""

    id = models.BigAutoField(primary_key=True)
    # db_index=False: the unique (session, seq) index serves lookups by session (one index less per insert).
    session = models.ForeignKey(Session, on_delete=models.PROTECT, related_name="messages", db_index=False)
    seq = models.PositiveIntegerField()
    role = models.CharField(max_length=16, choices=MessageRole.choices)
    content = models.TextField(blank=True)
    # Assistant messages that ask for tools carry the calls as the model stated them
    # ([{"id", "name", "arguments"}]); tool messages name the call they answer.
    tool_calls = models.JSONField(default=list, blank=True)
    tool_call_id = models.CharField(max_length=128, blank=True)
    tool_name = models.CharField(max_length=100, blank=True)
    run = models.ForeignKey("runs_app.Run", null=True, blank=True, on_delete=models.PROTECT, related_name="messages")
    step = models.ForeignKey("runs_app.Step", null=True, blank=True, on_delete=models.PROTECT, related_name="messages")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="message_session_seq_unique"),
            MESSAGE_ROW_RULES.constraint(),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.role}"


class InputMode(models.TextChoices):
    AUTO = "auto"
    SUPPLEMENT = "supplement"
    NEW_INTENT = "new_intent"
    QUEUE = "queue"


class InputDisposition(models.TextChoices):
    """What became of a pending input once a run read it."""

    SUPPLEMENTED = "supplemented"  # joined the active run's history
    # Started a run of its own (after an intent switch or from the queue), or — once held — was sent
    # as a new request by its user (queued again, as a new input, when another run was active).
    NEW_RUN = "new_run"
    DISCARDED = "discarded"  # the session's user withdrew it ("Drop it", once held)
    # Meant for a run that was cancelled before reading it: kept out of every run until the
    # session's user chooses (send it as a new request, or drop it), never started out of context.
    HELD = "held"


class PendingInput(models.Model):
    """User input that arrived while a run was busy. Never lost: it stays here until a run
    reads it at a safe point, and records what became of it."""

    id = models.BigAutoField(primary_key=True)
    session = models.ForeignKey(Session, on_delete=models.PROTECT, related_name="pending_inputs")
    content = models.TextField()
    mode = models.CharField(max_length=16, choices=InputMode.choices, default=InputMode.AUTO)
    # The mode actually applied (a classifier decides for `auto`), and why.
    resolved_mode = models.CharField(max_length=16, choices=InputMode.choices, blank=True)
    classification_reason = models.CharField(max_length=300, blank=True)
    received_at = models.DateTimeField(auto_now_add=True)
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_by = models.ForeignKey(
        "runs_app.Run", null=True, blank=True, on_delete=models.PROTECT, related_name="consumed_inputs"
    )
    disposition = models.CharField(max_length=16, choices=InputDisposition.choices, blank=True)
    message = models.OneToOneField(
        Message, null=True, blank=True, on_delete=models.PROTECT, related_name="pending_input"
    )
    submitted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT)
    # Set when the input was held (disposition `held`), and kept after the user's choice: the
    # cancelled run it was meant for, and why it was held, in words the customer reads.
    held_from = models.ForeignKey(
        "runs_app.Run", null=True, blank=True, on_delete=models.PROTECT, related_name="held_inputs"
    )
    held_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["session", "id"]
        indexes = [
            models.Index(fields=["session", "id"], condition=Q(consumed_at__isnull=True), name="pending_input_open"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(mode__in=InputMode.values), name="pending_input_mode_valid"),
            models.CheckConstraint(
                condition=Q(disposition="") | Q(disposition__in=InputDisposition.values),
                name="pending_input_disposition_valid",
            ),
            # Consumed exactly when a disposition is recorded: nothing is half-applied.
            models.CheckConstraint(
                condition=(Q(consumed_at__isnull=True) & Q(disposition=""))
                | (Q(consumed_at__isnull=False) & ~Q(disposition="")),
                name="pending_input_consumed_has_disposition",
            ),
            models.CheckConstraint(
                condition=~Q(disposition=InputDisposition.HELD) | (Q(held_from__isnull=False) & ~Q(held_reason="")),
                name="pending_input_held_says_why",
            ),
        ]


class ApiKey(models.Model):
    """A machine client's credential for the HTTP API. Only a SHA-256 hash of the secret is
    stored (the secret is shown once, at creation); `prefix` is the public part used to find
    the row, so a lookup never compares hashes across the table."""

    id = models.BigAutoField(primary_key=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"
        constraints = [
            models.CheckConstraint(condition=Q(secret_hash__regex=r"^[0-9a-f]{64}$"), name="api_key_hash_is_sha256"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class IdempotencyRecord(models.Model):
    """An unsafe API request sent with an `Idempotency-Key`, and the response it got (Stripe's
    semantics, api/idempotency.py): the same key and body again get the same response, the
    same key with another body is refused. Scoped to the caller; purged by the sweeper after
    WARDEN_IDEMPOTENCY_KEY_TTL_SECONDS."""

    id = models.BigAutoField(primary_key=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    # SHA-256 of method, path, query and body: what "the same request" means.
    request_hash = models.CharField(max_length=64)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=500)
    # Null while the first request with the key is still being answered.
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.BinaryField(blank=True, default=b"")
    response_content_type = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "key"], name="idempotency_key_unique_per_owner")]
        indexes = [models.Index(fields=["created_at"], name="idempotency_key_age")]

    def __str__(self) -> str:
        return f"{self.method} {self.path} ({self.key})"
