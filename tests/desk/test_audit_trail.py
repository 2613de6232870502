"""The audit trail in the admin: every human decision with its actor and before/after state,
readable, filterable, and impossible to change or delete."""

import pytest
from django.db import DatabaseError, transaction
from django.urls import reverse

from approvals_app.models import AuditEntry
from engine.actions.approvals import approval_decide
from tests.support.desk import csrf_client, csrf_token_of
from tests.support.factories import AuditEntryFactory

pytestmark = pytest.mark.django_db

TRAIL = reverse("admin:approvals_app_auditentry_changelist")


def test_a_decision_shows_in_the_trail_with_actor_and_before_after(operator, viewer, pending_refund):
    approval_decide(approval=pending_refund.approval, decision="approve", note="order checked", acting_user=operator)
    entry = AuditEntry.objects.get()
    client = csrf_client(viewer)
    listing = client.get(TRAIL).content.decode()
    assert "op" in listing and "approve" in listing and "status=pending → status=approved" in listing
    approval_page = reverse("admin:approvals_app_approval_change", args=[pending_refund.approval.pk])
    assert approval_page in listing  # the object links to its page
    detail = client.get(reverse("admin:approvals_app_auditentry_change", args=[entry.pk])).content.decode()
    assert "&quot;status&quot;: &quot;pending&quot;" in detail and "&quot;status&quot;: &quot;approved&quot;" in detail
    assert "order checked" in detail


def test_trail_filters_by_action_and_actor(viewer, operator):
    approve = AuditEntryFactory(action="approve", actor=operator)
    AuditEntryFactory(action="reconcile")
    client = csrf_client(viewer)
    by_action = client.get(TRAIL, {"action": "approve"}).context["cl"].result_list
    assert [e.pk for e in by_action] == [approve.pk]
    by_actor = client.get(TRAIL, {"actor__id__exact": operator.pk}).context["cl"].result_list
    assert [e.pk for e in by_actor] == [approve.pk]


def test_entries_cannot_be_added_changed_or_deleted(operator):
    from django.contrib.auth.models import Permission

    # Even a user holding every audit permission gets a read-only trail.
    operator.user_permissions.add(*Permission.objects.filter(content_type__app_label="approvals_app", codename__endswith="auditentry"))
    entry = AuditEntryFactory(note="original")
    client = csrf_client(operator)
    change = reverse("admin:approvals_app_auditentry_change", args=[entry.pk])
    token = csrf_token_of(client.get(change))
    assert client.get(reverse("admin:approvals_app_auditentry_add")).status_code == 403
    assert client.post(change, {"note": "rewritten", "csrfmiddlewaretoken": token}).status_code == 403
    delete = reverse("admin:approvals_app_auditentry_delete", args=[entry.pk])
    assert client.post(delete, {"post": "yes", "csrfmiddlewaretoken": token}).status_code == 403
    assert "delete_selected" not in client.get(TRAIL).content.decode()
    entry.refresh_from_db()
    assert entry.note == "original"
    # And the database refuses what the admin never offers.
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEntry.objects.filter(pk=entry.pk).update(note="rewritten")
