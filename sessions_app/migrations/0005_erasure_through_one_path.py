"""History stays append-only, with one exception: the retention and erasure path
(engine/actions/retention.py), which sets `warden.erasure` for its own transaction only, may
delete a session's history and detach audit entries from the runs it erases (the entries stay)."""

from django.db import migrations

ALLOW_ERASURE = """
CREATE OR REPLACE FUNCTION warden_refuse_mutation() RETURNS trigger AS $$
BEGIN
    IF current_setting('warden.erasure', true) = 'on' THEN
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'table % is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
"""

REFUSE_ALWAYS = """
CREATE OR REPLACE FUNCTION warden_refuse_mutation() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'table % is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
"""


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0004_idempotency_record"), ("approvals_app", "0004_approval_withdrawn")]

    operations = [migrations.RunSQL(ALLOW_ERASURE, reverse_sql=REFUSE_ALWAYS)]
