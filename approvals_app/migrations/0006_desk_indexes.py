"""Indexes for the desk: the audit trail (and the dashboard's recent decisions) newest first, and
approvals by request time (the queue's "all" view, the dashboard's approval waits by day)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("approvals_app", "0005_approval_customer_message"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="approval",
            index=models.Index(fields=["requested_at"], name="approval_requested"),
        ),
        migrations.AddIndex(
            model_name="auditentry",
            index=models.Index(fields=["-created_at", "-id"], name="audit_recent"),
        ),
    ]
