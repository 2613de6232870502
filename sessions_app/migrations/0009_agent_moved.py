"""Session.agent points at the Agent model in its new app (agents/0001); the column and its foreign
key are unchanged."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agents', '0001_initial'),
        ('sessions_app', '0008_fk_indexes_covered'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            # The tables stay as they are (the models name them with db_table): only Django's
            # state changes.
            state_operations=[
                migrations.AlterField(
                    model_name='session',
                    name='agent',
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='sessions', to='agents.agent'),
                ),
            ],
        ),
    ]
