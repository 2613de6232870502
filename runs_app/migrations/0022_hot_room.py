"""Room on each page for a run's and a session's next version (issue 34): a turn updates the run and
the session twice, none of them changing an indexed column, so PostgreSQL can update them in place
(HOT) — but only when the page has room; at the default fill factor of 100, a quarter of the run
updates of a 1,000-run benchmark were not HOT and each wrote a new entry into all of the run's
indexes. New pages keep 30 % free (existing rows move as they are updated); a finished run never
changes again, so that room is spent for good — 30 % rather than half, which was not measurably
faster (docs/BENCHMARKS.md, 2026-12-05 bis)."""

from django.db import migrations

TABLES = ("runs_app_run", "sessions_app_session", "runs_app_step")


class Migration(migrations.Migration):
    dependencies = [("runs_app", "0021_endpoint_kinds_step_answered_by"), ("sessions_app", "0011_pending_input_held")]

    operations = [
        migrations.RunSQL(
            sql=[f"ALTER TABLE {table} SET (fillfactor = 70)" for table in TABLES],
            reverse_sql=[f"ALTER TABLE {table} RESET (fillfactor)" for table in TABLES],
        ),
    ]
