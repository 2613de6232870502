"""Drop single-column foreign-key indexes a unique composite index already leads with (issue 16):
each was one more index entry (and WAL) per insert on the engine's hot path. Only the indexes go;
the foreign keys stay as they are, so nothing is re-validated."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs_app', '0014_fk_indexes_covered'),
        ('tools_app', '0004_tool_call_search_indexes'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='toolcall',
                    name='step',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='tool_calls', to='runs_app.step'),
                ),
            ],
            database_operations=[
                migrations.RunSQL('DROP INDEX IF EXISTS "tools_app_toolcall_step_id_06ebf427"', 'CREATE INDEX IF NOT EXISTS "tools_app_toolcall_step_id_06ebf427" ON "tools_app_toolcall" ("step_id")'),
            ],
        ),
    ]
