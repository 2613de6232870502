"""Drop single-column foreign-key indexes a unique composite index already leads with (issue 16):
each was one more index entry (and WAL) per insert on the engine's hot path. Only the indexes go;
the foreign keys stay as they are, so nothing is re-validated."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('sessions_app', '0007_agents'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='message',
                    name='session',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='messages', to='sessions_app.session'),
                ),
            ],
            database_operations=[
                migrations.RunSQL('DROP INDEX IF EXISTS "sessions_app_message_session_id_a5aec9af"', 'CREATE INDEX IF NOT EXISTS "sessions_app_message_session_id_a5aec9af" ON "sessions_app_message" ("session_id")'),
            ],
        ),
    ]
