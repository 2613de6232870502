"""History is immutable (SPEC §4): PostgreSQL itself refuses UPDATE and DELETE on messages,
so no code path, admin action or stray SQL can rewrite what the model and the user said.
TRUNCATE (used only by test teardown) is a statement-level operation and is not refused."""

from django.db import migrations

REFUSE_FUNCTION = """
CREATE OR REPLACE FUNCTION warden_refuse_mutation() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'table % is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
"""

MESSAGE_TRIGGER = """
CREATE TRIGGER message_append_only
BEFORE UPDATE OR DELETE ON sessions_app_message
FOR EACH ROW EXECUTE FUNCTION warden_refuse_mutation();
"""


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0001_initial")]

    operations = [
        migrations.RunSQL(REFUSE_FUNCTION, reverse_sql="DROP FUNCTION IF EXISTS warden_refuse_mutation() CASCADE;"),
        migrations.RunSQL(MESSAGE_TRIGGER, reverse_sql="DROP TRIGGER IF EXISTS message_append_only ON sessions_app_message;"),
    ]
