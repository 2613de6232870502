"""Drop single-column foreign-key indexes a unique composite index already leads with (issue 16):
each was one more index entry (and WAL) per insert on the engine's hot path. Only the indexes go;
the foreign keys stay as they are, so nothing is re-validated."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs_app', '0013_fence_check'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='runevent',
                    name='run',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='events', to='runs_app.run'),
                ),
                migrations.AlterField(
                    model_name='step',
                    name='run',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='steps', to='runs_app.run'),
                ),
            ],
            database_operations=[
                migrations.RunSQL('DROP INDEX IF EXISTS "runs_app_runevent_run_id_caf2a2b7"', 'CREATE INDEX IF NOT EXISTS "runs_app_runevent_run_id_caf2a2b7" ON "runs_app_runevent" ("run_id")'),
                migrations.RunSQL('DROP INDEX IF EXISTS "runs_app_step_run_id_24537bad"', 'CREATE INDEX IF NOT EXISTS "runs_app_step_run_id_24537bad" ON "runs_app_step" ("run_id")'),
            ],
        ),
    ]
