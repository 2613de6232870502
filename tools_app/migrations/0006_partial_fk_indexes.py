"""The foreign-key indexes of reused_from and resolved_by become partial (issue 16): nearly every
tool call has neither, yet each call written (and each status change, which is never a HOT
update) added an entry to both. Only the indexes change; the foreign keys stay as they are."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ('tools_app', '0005_fk_indexes_covered'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='toolcall',
                    name='reused_from',
                    field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='reused_by', to='tools_app.toolcall'),
                ),
                migrations.AlterField(
                    model_name='toolcall',
                    name='resolved_by',
                    field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL),
                ),
            ],
            database_operations=[
                migrations.RunSQL('DROP INDEX IF EXISTS "tools_app_toolcall_reused_from_id_baf0a138"',
                                  'CREATE INDEX IF NOT EXISTS "tools_app_toolcall_reused_from_id_baf0a138" ON "tools_app_toolcall" ("reused_from_id")'),
                migrations.RunSQL('DROP INDEX IF EXISTS "tools_app_toolcall_resolved_by_id_f5ad583e"',
                                  'CREATE INDEX IF NOT EXISTS "tools_app_toolcall_resolved_by_id_f5ad583e" ON "tools_app_toolcall" ("resolved_by_id")'),
            ],
        ),
        migrations.AddIndex(
            model_name='toolcall',
            index=models.Index(condition=models.Q(('reused_from__isnull', False)), fields=['reused_from'], name='tool_call_reused_from'),
        ),
        migrations.AddIndex(
            model_name='toolcall',
            index=models.Index(condition=models.Q(('resolved_by__isnull', False)), fields=['resolved_by'], name='tool_call_resolved_by'),
        ),
    ]
