"""Webhook endpoints (the receivers of notifications), the outbox's deliveries and their attempts
(docs/OPERATIONS.md, "Webhooks"), and the approval e-mails (docs/NOTIFICATIONS.md) — never their
bodies, which hold their recipients' decision links."""

from django import forms
from django.contrib import admin, messages

from desk.base import ReadOnlyAdmin, ReadOnlyInline
from desk.display import pretty_json
from notifications.models import EmailDelivery, NotificationKind, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from notifications.services import email_deliveries_retry_now, url_redacted, webhook_deliveries_retry_now
from notifications.targets import webhook_url_refusal


class WebhookEndpointForm(forms.ModelForm):
    url = forms.URLField(max_length=500, assume_scheme="https", help_text="Where deliveries are POSTed.")
    kinds = forms.MultipleChoiceField(choices=NotificationKind.choices, widget=forms.CheckboxSelectMultiple, required=False,
                                      help_text="What this receiver is told about.")

    class Meta:
        model = WebhookEndpoint
        fields = ("name", "url", "format", "kinds", "active", "secret")

    def clean_url(self):
        url = self.cleaned_data["url"]
        if refusal := webhook_url_refusal(url):
            raise forms.ValidationError(f"Not a receiver Warden sends to: {refusal}.")
        return url


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = WebhookEndpointForm
    list_display = ("name", "url_shown", "format", "kinds_display", "active", "created_at")
    list_filter = ("active", "format")
    readonly_fields = ("created_at", "updated_at")

    @admin.display(description="url", ordering="url")
    def url_shown(self, obj):
        return url_redacted(obj.url)  # the token a receiver puts in its URL stays on the endpoint's own page

    @admin.display(description="kinds")
    def kinds_display(self, obj):
        return ", ".join(obj.kinds) or "—"


class WebhookAttemptInline(ReadOnlyInline):
    model = WebhookAttempt
    fields = ("number", "deliverer", "started_at", "finished_at", "status_code", "error", "response_excerpt")
    readonly_fields = fields
    show_change_link = False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "endpoint", "status", "attempts", "last_status_code", "next_attempt_at", "created_at", "delivered_at")
    list_select_related = ("endpoint",)
    list_filter = ("status", "kind", "endpoint")
    search_fields = ("=id", "=run__id")
    readonly_fields = ("id", "endpoint", "kind", "run", "event_seq", "body_display", "status", "attempts", "next_attempt_at",
                       "claimed_by", "claimed_until", "last_status_code", "last_error", "created_at", "delivered_at")
    fields = readonly_fields
    inlines = [WebhookAttemptInline]
    actions = ("retry_now",)

    @admin.display(description="body")
    def body_display(self, obj):
        return pretty_json(obj.body)

    @admin.action(description="Attempt the selected deliveries again now", permissions=["view"])
    def retry_now(self, request, queryset):
        if not request.user.has_perm("notifications.change_webhookdelivery"):
            messages.error(request, "You may not retry deliveries (notifications.change_webhookdelivery).")
            return
        count = webhook_deliveries_retry_now(deliveries=queryset)
        messages.success(request, f"{count} deliver{'y' if count == 1 else 'ies'} will be attempted again at once.")


@admin.register(WebhookAttempt)
class WebhookAttemptAdmin(ReadOnlyAdmin):
    list_display = ("delivery", "number", "deliverer", "started_at", "finished_at", "status_code", "error")
    list_select_related = ("delivery", "delivery__endpoint")
    search_fields = ("=delivery__id",)


@admin.register(EmailDelivery)
class EmailDeliveryAdmin(ReadOnlyAdmin):
    """Approval e-mails: to whom, about what, and what became of them. The body is never shown — it
    holds the recipient's decision link, which is theirs alone."""

    list_display = ("id", "kind", "to", "subject", "status", "attempts", "next_attempt_at", "created_at", "sent_at")
    list_filter = ("status", "kind")
    search_fields = ("=id", "=run__id", "=approval_id", "to")
    readonly_fields = ("id", "kind", "recipient", "to", "subject", "run", "approval_id", "status", "attempts",
                       "next_attempt_at", "claimed_by", "claimed_until", "last_error", "created_at", "sent_at")
    fields = readonly_fields
    actions = ("retry_now",)

    @admin.action(description="Attempt the selected e-mails again now", permissions=["view"])
    def retry_now(self, request, queryset):
        if not request.user.has_perm("notifications.change_emaildelivery"):
            messages.error(request, "You may not retry e-mails (notifications.change_emaildelivery).")
            return
        count = email_deliveries_retry_now(deliveries=queryset)
        messages.success(request, f"{count} e-mail{'' if count == 1 else 's'} will be attempted again at once.")
