import uuid

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q


class ApprovalPolicy(models.TextChoices):
    USER = "user", "The session's user"
    OPERATOR = "operator", "An operator with permission"


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"  # the run was cancelled before anyone decided


class Approval(models.Model):
    """A human decision a write tool call waits for. Only a recorded decision by an
    authorized person lets the call execute; nothing the model writes counts (SPEC §7)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tool_call = models.OneToOneField("tools_app.ToolCall", on_delete=models.PROTECT, related_name="approval")
    run = models.ForeignKey("runs_app.Run", on_delete=models.PROTECT, related_name="approvals")
    policy = models.CharField(max_length=12, choices=ApprovalPolicy.choices)
    status = models.CharField(max_length=12, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    requested_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    # The decider's internal note: the desk and the audit trail only.
    note = models.TextField(blank=True)
    # What the decider chose to tell the customer; the model is told it and passes it on.
    customer_message = models.CharField(max_length=300, blank=True)
    # How many distinct operators must approve (a quorum, from the agent's rule); one rejection rejects.
    required_approvals = models.PositiveSmallIntegerField(default=1)
    # The agent's rule that asked for this approval (`tool[index]: condition → who`) and why it
    # applied to these arguments; blank: the tool's own policy (no agent rule).
    # The digest of the call as it was put to the deciders (tools_app.services.tool_call_digest).
    digest = models.CharField(max_length=64, blank=True)
    rule = models.CharField(max_length=300, blank=True)
    rule_reason = models.CharField(max_length=500, blank=True)
    # Who edited the request's arguments before it was decided (engine.actions.approvals.approval_edit):
    # parties to the write, who may not decide it (SPEC §18). User ids, in order.
    editors = ArrayField(models.IntegerField(), default=list, blank=True)
    # Service levels (docs/NOTIFICATIONS.md): when the deciders were first told, reminded, and when
    # the request was escalated to the agent's second group (its name), by the sweeper.
    notified_at = models.DateTimeField(null=True, blank=True)
    reminded_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    escalated_to = models.CharField(max_length=150, blank=True)
    # Who on the shift works this request (issue 29): a person who may decide it, set and cleared
    # only by engine.actions.approvals.approval_assign, audited. Nobody is bound by it: any decider
    # may still decide; it says who has it in hand.
    assigned_to = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                    related_name="+")
    assigned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["requested_at"]
        permissions = [("decide_approval", "Can approve or reject operator-level tool calls")]
        constraints = [
            models.CheckConstraint(condition=Q(policy__in=ApprovalPolicy.values), name="approval_policy_valid"),
            models.CheckConstraint(condition=Q(status__in=ApprovalStatus.values), name="approval_status_valid"),
            models.CheckConstraint(
                condition=Q(status=ApprovalStatus.PENDING) | Q(decided_at__isnull=False),
                name="approval_decided_has_time",
            ),
            # Approve and reject are human decisions and name the human; expiry is the clock's.
            models.CheckConstraint(
                condition=~Q(status__in=[ApprovalStatus.APPROVED, ApprovalStatus.REJECTED])
                | Q(decided_by__isnull=False),
                name="approval_human_decision_names_decider",
            ),
            models.CheckConstraint(
                condition=~Q(status=ApprovalStatus.PENDING) | Q(decided_by__isnull=True),
                name="approval_pending_undecided",
            ),
            # A quorum is of operators; a customer's confirmation is one person's.
            models.CheckConstraint(
                condition=Q(required_approvals__gte=1) & (Q(required_approvals=1) | Q(policy=ApprovalPolicy.OPERATOR)),
                name="approval_quorum_of_operators",
            ),
        ]
        indexes = [
            models.Index(fields=["requested_at"], condition=Q(status="pending"), name="approval_pending_oldest"),
            # The desk's "all" view of the queue, and the dashboard's approval waits by day.
            models.Index(fields=["requested_at"], name="approval_requested"),
            # The queue's "Mine" view: one operator's pending requests, oldest first.
            models.Index(fields=["assigned_to", "requested_at"], condition=Q(status="pending"), name="approval_pending_assigned"),
        ]

    def __str__(self) -> str:
        return f"Approval {self.id} ({self.status})"


class ApprovalDecision(models.Model):
    """One person's decision on an approval: a quorum approval is approved once
    `required_approvals` distinct people approved it, rejected by the first rejection. Every
    decision, a lone one too, is a row here (and an audit entry)."""

    id = models.BigAutoField(primary_key=True)
    approval = models.ForeignKey(Approval, on_delete=models.PROTECT, related_name="decisions")
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    decision = models.CharField(max_length=8, choices=[("approve", "approve"), ("reject", "reject")])
    note = models.TextField(blank=True)
    decided_at = models.DateTimeField(auto_now_add=True)
    # The digest of exactly what this person decided on: the call executes only if it still matches.
    digest = models.CharField(max_length=64, blank=True)
    # When an operator's edit of the call voided this approval (SPEC §18): it no longer counts
    # towards the quorum, and the person may approve the edited call afresh.
    voided_at = models.DateTimeField(null=True, blank=True)
    # Who the decider stood in for (an out-of-office delegation, `Delegation`): both names are the
    # decision's, and neither may count again in the same quorum.
    on_behalf_of = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                     related_name="+")

    class Meta:
        ordering = ["approval", "decided_at", "id"]
        constraints = [
            # Distinct deciders among the decisions that count, whatever the code does.
            models.UniqueConstraint(fields=["approval", "decided_by"], condition=Q(voided_at__isnull=True),
                                    name="approval_decision_one_per_person"),
            models.CheckConstraint(condition=Q(decision__in=["approve", "reject"]), name="approval_decision_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.decision} by {self.decided_by_id}"


class AuditEntry(models.Model):
    """An immutable record of a human decision (approve, reject, reconcile, cancel).
    The database refuses UPDATE and DELETE on this table."""

    id = models.BigAutoField(primary_key=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+")
    action = models.CharField(max_length=40)
    object_type = models.CharField(max_length=40)
    object_id = models.CharField(max_length=64)
    run = models.ForeignKey("runs_app.Run", null=True, blank=True, on_delete=models.PROTECT, related_name="audit")
    before = models.JSONField(default=dict)
    after = models.JSONField(default=dict)
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [
            models.Index(fields=["object_type", "object_id"], name="audit_object"),
            # The trail newest first, and the dashboard's recent decisions.
            models.Index(fields=["-created_at", "-id"], name="audit_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.object_type} {self.object_id}"


class FreezeScope(models.TextChoices):
    AGENT = "agent"
    TOOL = "tool"
    CUSTOMER = "customer"


class FreezeMode(models.TextChoices):
    # Writes of the scope wait (`waiting / frozen`) until the freeze is lifted, then go on.
    WAIT = "wait"
    # Writes of the scope are refused: the call fails, nothing is sent.
    REFUSE = "refuse"


class Freeze(models.Model):
    """An operator's stop on money movement (SPEC §18): from its commit on, no write of an agent
    (its slug), a tool (its name) or a customer (their username) starts until it is lifted. Reads
    and conversations go on. Set and lifted through engine.actions.freezes, audited."""

    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(max_length=10, choices=FreezeScope.choices)
    target = models.CharField(max_length=150)
    mode = models.CharField(max_length=8, choices=FreezeMode.choices, default=FreezeMode.WAIT)
    reason = models.TextField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    lifted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                  related_name="+")
    lifted_at = models.DateTimeField(null=True, blank=True)
    lift_note = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [("freeze_money", "Can freeze and unfreeze money movement")]
        constraints = [
            models.CheckConstraint(condition=Q(scope__in=FreezeScope.values), name="freeze_scope_valid"),
            models.CheckConstraint(condition=Q(mode__in=FreezeMode.values), name="freeze_mode_valid"),
            models.UniqueConstraint(fields=["scope", "target"], condition=Q(lifted_at__isnull=True),
                                    name="freeze_one_active_per_target"),
        ]

    def __str__(self) -> str:
        state = "lifted" if self.lifted_at else self.mode
        return f"{self.scope} {self.target} ({state})"


class LedgerEntry(models.Model):
    """One link of the tamper-evident ledger (docs/LEDGER.md): a human decision or a money-moving
    call's outcome, chained to the entry before it by `prev_hash`. Written only by the SQL function
    `warden_ledger_append` (approvals_app.ledger.ledger_append), which numbers, stamps and hashes
    it under one lock; the database refuses UPDATE and DELETE. No foreign keys: an entry outlives
    the rows it names (erasure, retention)."""

    seq = models.BigIntegerField(primary_key=True)
    created_at = models.DateTimeField()
    kind = models.CharField(max_length=40)
    # The person's username, or "system" (the sweeper, the run-time); actor_id names the person
    # even if the username changes later.
    actor = models.CharField(max_length=150)
    actor_id = models.IntegerField(null=True, blank=True)
    # What it is about: "<type>:<id>" (approval:…, tool_call:…, freeze:…).
    subject = models.CharField(max_length=100)
    # Canonical JSON (sorted keys, no spaces): exactly the text that was hashed.
    payload = models.TextField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["seq"]
        verbose_name_plural = "ledger entries"
        permissions = [("export_ledger", "Can export the tamper-evident ledger")]
        indexes = [models.Index(fields=["created_at"], name="ledger_entry_created")]

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind} {self.subject}"


class LinkStage(models.TextChoices):
    REQUESTED = "requested", "Requested"
    REMINDER = "reminder", "Reminder"
    ESCALATION = "escalation", "Escalation"


class ApprovalLink(models.Model):
    """A signed, single-use, expiring link to decide one approval, sent to one decider in a
    notification (docs/NOTIFICATIONS.md): bound to the approval, the decider (and whom they stand in
    for) and the digest of the call as it was put to them. Following it shows the decision page once
    the decider signs in; only a POST decides, asking the same access policy as the desk, and spends
    the link in the decision's transaction. Written by approvals_app.links."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    approval = models.ForeignKey(Approval, on_delete=models.PROTECT, related_name="links")
    decider = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    on_behalf_of = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                     related_name="+")
    digest = models.CharField(max_length=64)
    stage = models.CharField(max_length=12, choices=LinkStage.choices, default=LinkStage.REQUESTED)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(stage__in=LinkStage.values), name="approval_link_stage_valid"),
            models.CheckConstraint(condition=~Q(on_behalf_of=models.F("decider")), name="approval_link_not_own_delegate"),
        ]

    def __str__(self) -> str:
        return f"link {self.id} for {self.decider_id} ({'used' if self.used_at else 'open'})"


class Delegation(models.Model):
    """An out-of-office delegation: from `starts_at` to `ends_at` the delegate may decide what the
    delegator may, in the delegator's name and their own (both recorded), and receives the delegator's
    approval notifications. Never their own session's, never twice in one quorum (access.policy).
    Set and revoked through engine.actions.delegations, audited."""

    id = models.BigAutoField(primary_key=True)
    delegator = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="delegations_given")
    delegate = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="delegations_held")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    reason = models.CharField(max_length=300, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-starts_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=~Q(delegate=models.F("delegator")), name="delegation_not_to_oneself"),
            models.CheckConstraint(condition=Q(ends_at__gt=models.F("starts_at")), name="delegation_ends_after_start"),
        ]
        indexes = [models.Index(fields=["delegate", "ends_at"], name="delegation_held")]

    def __str__(self) -> str:
        return f"{self.delegator_id} → {self.delegate_id}"


class SavedView(models.Model):
    """One operator's named view of a desk list (issue 29): the path and query string of an admin
    changelist, its filters and search as they were when saved. Seen and deleted by its owner
    alone; written through engine.actions.saved_views."""

    id = models.BigAutoField(primary_key=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_views")
    name = models.CharField(max_length=80)
    # "/admin/approvals_app/approval/?assigned=mine": a path of this site, never another host.
    url = models.CharField(max_length=500)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["owner", "name"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="saved_view_name_per_owner"),
            # A path on this site: no scheme, no other host ("//evil.example/…").
            models.CheckConstraint(condition=Q(url__startswith="/") & ~Q(url__startswith="//"), name="saved_view_local_path"),
        ]

    def __str__(self) -> str:
        return self.name
