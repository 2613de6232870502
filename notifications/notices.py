"""Approval notices (docs/NOTIFICATIONS.md): the people who may decide an operator approval are told
of it — when it is requested, reminded and escalated — each with a decision link of their own.

`approval_notices` runs in the caller's transaction (the run's, for a request: `notifications_for_events`
calls it beside the webhook rows), so nothing is written for a request that rolled back. Per
recipient it writes one `ApprovalLink` (approvals_app.links: signed, single-use, expiring, bound to
the approval, the decider and the call's digest) and, when WARDEN_APPROVAL_EMAIL is on, one
`EmailDelivery`; per active chat endpoint (slack or teams format) subscribed to the notice's kind,
one `WebhookDelivery` holding a chat message with one action link per recipient. Delivery is the
outbox's: engine/mailer.py and engine/webhooks.py.

Who is told: active users with an e-mail address who may decide the approval now — the access
policy's answer, which the caller hands in as `decider_refusal` (this layer does not import the
policy) — narrowed to a group when the agent's service level names one. A recipient out of office
is replaced by their delegate, deciding in their name (`on_behalf_of`), unless the delegate is told
in their own right already. A customer's confirmation (policy `user`) is nobody else's: no notice.
"""

from dataclasses import dataclass
from typing import Callable

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db.models import Q
from django.utils import timezone

from agents.service_levels import service_level_of
from approvals_app.links import link_create, link_url
from approvals_app.models import Approval, ApprovalPolicy, ApprovalStatus, LinkStage
from approvals_app.selectors import delegations_in_force
from notifications.models import EmailDelivery, NotificationKind, WebhookDelivery, WebhookEndpoint, WebhookFormat

# access.policy.why_not_a_decider's shape: '' when `user` may decide `approval` (for `on_behalf_of`).
DeciderRefusal = Callable[..., str]

_KIND_OF_STAGE = {LinkStage.REQUESTED: NotificationKind.APPROVAL_REQUESTED,
                  LinkStage.REMINDER: NotificationKind.APPROVAL_REQUESTED,
                  LinkStage.ESCALATION: NotificationKind.APPROVAL_ESCALATED}
_SLACK_BUTTONS_PER_BLOCK = 25  # Slack's limit of elements in one actions block
_ARGUMENTS_SHOWN = 500


@dataclass(frozen=True)
class Recipient:
    """Who gets a notice: the decider its link is bound to, and whom they stand in for (or None)."""

    decider: object
    on_behalf_of: object = None


def approval_notices(*, approval_id, stage: str, decider_refusal: DeciderRefusal | None, group: str = "",
                     event_seq: int | None = None) -> int:
    """Notices of the approval `approval_id` at `stage` (LinkStage) to its deciders — `group`'s members when given,
    else the service level's `notify` group (a request, a reminder), else everyone who may decide —
    with chat deliveries numbered `event_seq` (the run event that caused them; None for a reminder,
    which has none). Returns how many messages were written (e-mails and chat deliveries)."""
    kind = _KIND_OF_STAGE[stage]
    chats = list(WebhookEndpoint.objects.filter(active=True, kinds__contains=[kind],
                                                format__in=[WebhookFormat.SLACK, WebhookFormat.TEAMS]))
    if not settings.WARDEN_APPROVAL_EMAIL and not chats:
        return 0  # no channel: nobody to tell, nothing to read
    approval = (Approval.objects.select_related("run__session__owner", "run__agent_version", "tool_call")
                .get(pk=approval_id))
    if approval.policy != ApprovalPolicy.OPERATOR or approval.status != ApprovalStatus.PENDING:
        return 0
    if not group and stage != LinkStage.ESCALATION:
        group = service_level_of(approval.run.agent_version, approval.policy).get("notify", "")
    recipients = approval_recipients(approval=approval, group=group, decider_refusal=decider_refusal)
    links = [(recipient, link_url(link_create(approval=approval, decider=recipient.decider, stage=stage,
                                              on_behalf_of=recipient.on_behalf_of)))
             for recipient in recipients]
    text = _NoticeText(approval=approval, stage=stage, group=group)
    written = 0
    if settings.WARDEN_APPROVAL_EMAIL:
        EmailDelivery.objects.bulk_create([
            EmailDelivery(kind=kind, recipient=recipient.decider, to=recipient.decider.email, subject=text.subject(),
                          body=text.email_body(recipient=recipient, url=url), run_id=approval.run_id,
                          approval_id=approval.pk)
            for recipient, url in links
        ])
        written += len(links)
    WebhookDelivery.objects.bulk_create([
        WebhookDelivery(endpoint=endpoint, kind=kind, run_id=approval.run_id, event_seq=event_seq,
                        body=chat_message(format=endpoint.format, text=text.chat_text(), links=links))
        for endpoint in chats
    ])
    written += len(chats)
    if written:
        Approval.objects.filter(pk=approval.pk, notified_at__isnull=True).update(notified_at=timezone.now())
    return written


def approval_recipients(*, approval: Approval, group: str, decider_refusal: DeciderRefusal | None) -> list[Recipient]:
    """Everyone to tell of `approval`, in username order (see the module's docstring). Without the
    policy (`decider_refusal` None) nobody: a link is only ever sent to someone it may serve."""
    if decider_refusal is None:
        return []
    candidates = [user for user in deciders_with_permission(group=group)
                  if user.email and not decider_refusal(user=user, approval=approval)]
    told = {user.pk for user in candidates}
    # Who stands in for whom now, in one read (the latest delegation of each delegator in force).
    delegates = {}
    for delegation in (delegations_in_force().filter(delegator_id__in=told).select_related("delegate")
                       .order_by("delegator_id", "-starts_at", "-id")):
        delegates.setdefault(delegation.delegator_id, delegation.delegate)
    recipients = []
    for user in candidates:
        delegate = delegates.get(user.pk)
        if delegate is None or not delegate.is_active or not delegate.email or decider_refusal(
                user=delegate, approval=approval, on_behalf_of=user):
            recipients.append(Recipient(decider=user))  # nobody may stand in: told themselves
        elif delegate.pk not in told:
            recipients.append(Recipient(decider=delegate, on_behalf_of=user))
            told.add(delegate.pk)
    return recipients


def deciders_with_permission(*, group: str = ""):
    """Active users holding approvals_app.decide_approval — in their own right, through a group, or
    as superusers — narrowed to `group`'s members when given."""
    permission = Permission.objects.filter(codename="decide_approval", content_type__app_label="approvals_app").first()
    holds = Q(is_superuser=True)
    if permission is not None:
        holds |= Q(user_permissions=permission) | Q(groups__permissions=permission)
    users = get_user_model().objects.filter(holds, is_active=True).distinct()
    if group:
        users = users.filter(pk__in=get_user_model().objects.filter(groups__name=group).values("pk"))
    return users.order_by("username")


class _NoticeText:
    """The words of one notice: what is asked, for whom, why, until when — the same in every channel."""

    def __init__(self, *, approval: Approval, stage: str, group: str):
        self.approval, self.stage, self.group = approval, stage, group
        self.call = approval.tool_call

    def headline(self) -> str:
        if self.stage == LinkStage.REMINDER:
            return "Reminder: an approval is still waiting"
        if self.stage == LinkStage.ESCALATION:
            return f"Escalated to {self.approval.escalated_to or self.group}: an approval is still waiting"
        return "Approval requested"

    def what(self) -> str:
        arguments = self.call.arguments or {}
        money = f" of {arguments['amount']} {arguments.get('currency', '')}".rstrip() if "amount" in arguments else ""
        return f"{self.call.tool_name}{money} for {self.approval.run.session.owner.get_username()}"

    def subject(self) -> str:
        return f"[Warden] {self.headline()}: {self.what()}"[:200]

    def details(self) -> list[str]:
        arguments = _json_short(self.call.arguments or {})
        lines = [f"Tool: {self.call.tool_name}", f"Arguments: {arguments}",
                 f"Customer: {self.approval.run.session.owner.get_username()}"]
        if self.approval.rule_reason:
            lines.append(f"Why it needs a decision: {self.approval.rule_reason}")
        if self.approval.required_approvals > 1:
            lines.append(f"Approvals needed: {self.approval.required_approvals}")
        lines.append(f"Expires: {timezone.localtime(self.approval.expires_at):%H:%M %Z, %d %b %Y}")
        return lines

    def email_body(self, *, recipient: Recipient, url: str) -> str:
        name = recipient.decider.get_username()
        for_whom = (f" in place of {recipient.on_behalf_of.get_username()} (out of office; you decide in their name)"
                    if recipient.on_behalf_of is not None else "")
        return "\n".join([
            f"{self.headline()}.", "", *self.details(), "",
            f"Your decision link, {name}{for_whom}:", url, "",
            "The link is yours alone: it works once, only while you are signed in as "
            f"{name}, only for the request as it stands now, and until it expires.",
        ]) + "\n"

    def chat_text(self) -> str:
        return f"*{self.headline()}*: {self.what()}\n" + "\n".join(self.details()[1:])


def chat_message(*, format: str, text: str, links: list[tuple[Recipient, str]]) -> dict:
    """A chat's incoming-webhook message: Slack's `text` and blocks with one button per decider, or a
    Teams MessageCard with one OpenUri action per decider."""
    labelled = [(_label(recipient), url) for recipient, url in links]
    if format == WebhookFormat.TEAMS:
        return {"@type": "MessageCard", "@context": "https://schema.org/extensions", "summary": text.splitlines()[0],
                "text": text.replace("\n", "\n\n"),
                "potentialAction": [{"@type": "OpenUri", "name": label, "targets": [{"os": "default", "uri": url}]}
                                    for label, url in labelled]}
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
    for start in range(0, len(labelled), _SLACK_BUTTONS_PER_BLOCK):
        blocks.append({"type": "actions", "elements": [
            {"type": "button", "text": {"type": "plain_text", "text": label}, "url": url}
            for label, url in labelled[start:start + _SLACK_BUTTONS_PER_BLOCK]]})
    return {"text": text, "blocks": blocks}


def chat_text_message(*, format: str, text: str, url: str) -> dict:
    """A chat message for a notification that carries no decision (a run failed, a write to
    reconcile): the words and a link to the desk."""
    if format == WebhookFormat.TEAMS:
        return {"@type": "MessageCard", "@context": "https://schema.org/extensions", "summary": text, "text": text,
                "potentialAction": [{"@type": "OpenUri", "name": "Open in the desk",
                                     "targets": [{"os": "default", "uri": url}]}]}
    return {"text": f"{text} <{url}|Open in the desk>"}


def _label(recipient: Recipient) -> str:
    name = recipient.decider.get_username()
    if recipient.on_behalf_of is not None:
        return f"Decide as {name} (for {recipient.on_behalf_of.get_username()})"
    return f"Decide as {name}"


def _json_short(value: dict) -> str:
    text = ", ".join(f"{key}={val}" for key, val in value.items())
    return text if len(text) <= _ARGUMENTS_SHOWN else text[:_ARGUMENTS_SHOWN - 1] + "…"
