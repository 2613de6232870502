"""A write's business key becomes a fact of the deployment (issue 26). Calls made before keep
their run-scoped idempotency keys (`<tool>:<run id>:<business key>[:retry<n>]`); their business
key is read back from those, so a payout booked before the upgrade is not booked again after it."""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs_app', '0016_queued_tasks_name_the_engine'),
        ('tools_app', '0006_partial_fk_indexes'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='toolcall',
            name='business_key',
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.RunSQL(
            r"""
            UPDATE tools_app_toolcall SET business_key = left(tool_name || ':' || regexp_replace(
                regexp_replace(idempotency_key, '^[^:]+:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}:', ''),
                ':retry[0-9]+$', ''), 200)
             WHERE effect = 'write'
               AND idempotency_key ~ '^[^:]+:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}:';
            UPDATE tools_app_toolcall AS reuse SET business_key = original.business_key
              FROM tools_app_toolcall AS original
             WHERE reuse.reused_from_id = original.id AND original.business_key IS NOT NULL;
            """,
            migrations.RunSQL.noop,
        ),
        migrations.AddIndex(
            model_name='toolcall',
            index=models.Index(condition=models.Q(('business_key__isnull', False)), fields=['business_key', 'created_at'], name='tool_call_business_key'),
        ),
    ]
