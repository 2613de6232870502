"""`warden_fence_check(ok, what)`: raises (SQLSTATE WF001) unless `ok`. The engine's one-statement
step commits (engine/state/fast.py) end with it, so a statement whose fence or status check
missed writes nothing at all: the whole statement is one transaction, and the error undoes it."""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION warden_fence_check(ok boolean, what text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION 'warden fence: %', what USING ERRCODE = 'WF001';
    END IF;
    RETURN true;
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("runs_app", "0012_agents")]

    operations = [migrations.RunSQL(CREATE, "DROP FUNCTION IF EXISTS warden_fence_check(boolean, text);")]
