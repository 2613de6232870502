"""Audit entries record human decisions; the database refuses to change or remove them."""

from django.db import migrations

AUDIT_TRIGGER = """
CREATE TRIGGER audit_entry_append_only
BEFORE UPDATE OR DELETE ON approvals_app_auditentry
FOR EACH ROW EXECUTE FUNCTION warden_refuse_mutation();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("approvals_app", "0002_initial"),
        ("sessions_app", "0002_message_append_only"),  # defines warden_refuse_mutation()
    ]

    operations = [
        migrations.RunSQL(AUDIT_TRIGGER, reverse_sql="DROP TRIGGER IF EXISTS audit_entry_append_only ON approvals_app_auditentry;"),
    ]
