"""The models that moved to agents, notifications and operations leave runs_app's state; their tables
stay (the new apps own them under the same names)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('operations', '0001_initial'),
        ('notifications', '0001_initial'),
        ('agents', '0001_initial'),
        ('runs_app', '0014_fk_indexes_covered'),
        ('sessions_app', '0009_agent_moved'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            # The tables stay as they are (the models name them with db_table): only Django's
            # state changes.
            state_operations=[
                migrations.RemoveField(
                    model_name='agent',
                    name='current_version',
                ),
                migrations.RemoveField(
                    model_name='agentversion',
                    name='agent',
                ),
                migrations.RemoveField(
                    model_name='agentversion',
                    name='created_by',
                ),
                migrations.AlterField(
                    model_name='run',
                    name='agent_version',
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='runs', to='agents.agentversion'),
                ),
                migrations.DeleteModel(
                    name='ProcessHeartbeat',
                ),
                migrations.RemoveField(
                    model_name='webhookattempt',
                    name='delivery',
                ),
                migrations.RemoveField(
                    model_name='webhookdelivery',
                    name='endpoint',
                ),
                migrations.RemoveField(
                    model_name='webhookdelivery',
                    name='run',
                ),
                migrations.DeleteModel(
                    name='Agent',
                ),
                migrations.DeleteModel(
                    name='AgentVersion',
                ),
                migrations.DeleteModel(
                    name='WebhookAttempt',
                ),
                migrations.DeleteModel(
                    name='WebhookEndpoint',
                ),
                migrations.DeleteModel(
                    name='WebhookDelivery',
                ),
            ],
        ),
    ]
