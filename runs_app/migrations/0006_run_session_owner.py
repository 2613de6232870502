"""The owner of a run's session, copied onto the run, with indexes for the HTTP API's runs list.

Why: users see the runs of their own sessions, newest first. Through the join
(runs → sessions.owner_id) PostgreSQL can only walk `run_recent` and test each run's session,
which for a user owning 0.2% of a million runs reads ~25,000 index entries for one page (a user
with no runs reads them all). With the owner on the run, a page is a range scan of
`run_owner_recent` / `run_owner_status_recent`: ~limit rows whatever the table size.

The column is maintained by the database, not by Django: a BEFORE INSERT trigger copies it
from the session (runs never move between sessions, and a session's owner never changes — a
second trigger keeps runs in step should that ever happen), so no write path has to remember
it. It is not a model field; runs_app.selectors reads it through RawSQL. If `Run` ever gets
a real owner field, adopt this column with SeparateDatabaseAndState.
"""

from django.db import migrations

FORWARD = """
ALTER TABLE runs_app_run ADD COLUMN session_owner_id integer;
UPDATE runs_app_run AS r SET session_owner_id = s.owner_id FROM sessions_app_session AS s WHERE s.id = r.session_id;
ALTER TABLE runs_app_run ALTER COLUMN session_owner_id SET NOT NULL;

CREATE FUNCTION runs_app_run_copy_session_owner() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    SELECT owner_id INTO NEW.session_owner_id FROM sessions_app_session WHERE id = NEW.session_id;
    RETURN NEW;
END $$;
CREATE TRIGGER run_copy_session_owner BEFORE INSERT OR UPDATE OF session_id ON runs_app_run
    FOR EACH ROW EXECUTE FUNCTION runs_app_run_copy_session_owner();

CREATE FUNCTION sessions_app_session_propagate_owner() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runs_app_run SET session_owner_id = NEW.owner_id WHERE session_id = NEW.id;
    RETURN NEW;
END $$;
CREATE TRIGGER session_propagate_owner AFTER UPDATE OF owner_id ON sessions_app_session
    FOR EACH ROW WHEN (OLD.owner_id IS DISTINCT FROM NEW.owner_id)
    EXECUTE FUNCTION sessions_app_session_propagate_owner();

CREATE INDEX run_owner_recent ON runs_app_run (session_owner_id, created_at DESC, id DESC);
CREATE INDEX run_owner_status_recent ON runs_app_run (session_owner_id, status, created_at DESC, id DESC);
"""

BACKWARD = """
DROP TRIGGER session_propagate_owner ON sessions_app_session;
DROP FUNCTION sessions_app_session_propagate_owner();
DROP TRIGGER run_copy_session_owner ON runs_app_run;
DROP FUNCTION runs_app_run_copy_session_owner();
ALTER TABLE runs_app_run DROP COLUMN session_owner_id;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("runs_app", "0005_resume_target_length"),
        ("sessions_app", "0001_initial"),
    ]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
