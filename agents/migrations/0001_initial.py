"""Agent and AgentVersion move here from runs_app (the floor plan, issue 25): their tables keep their
names and rows; the content types follow, so permissions granted on them still hold."""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from config.migration_ops import content_types_moved


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('contenttypes', '0002_remove_content_type_name'),
        ('runs_app', '0014_fk_indexes_covered'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            # The tables stay as they are (the models name them with db_table): only Django's
            # state changes.
            state_operations=[
                migrations.CreateModel(
                    name='Agent',
                    fields=[
                        ('id', models.BigAutoField(primary_key=True, serialize=False)),
                        ('slug', models.SlugField(max_length=64, unique=True)),
                        ('name', models.CharField(max_length=100)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                    ],
                    options={
                        'db_table': 'runs_app_agent',
                        'ordering': ['name', 'id'],
                    },
                ),
                migrations.CreateModel(
                    name='AgentVersion',
                    fields=[
                        ('id', models.BigAutoField(primary_key=True, serialize=False)),
                        ('number', models.PositiveIntegerField()),
                        ('name', models.CharField(max_length=100)),
                        ('instructions', models.TextField()),
                        ('provider', models.CharField(max_length=32)),
                        ('model', models.CharField(blank=True, max_length=100)),
                        ('provider_options', models.JSONField(blank=True, default=dict)),
                        ('tools', django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=100), blank=True, default=list, size=None)),
                        ('budgets', models.JSONField(blank=True, default=dict)),
                        ('budget_limits', models.JSONField(blank=True, default=dict)),
                        ('approval_rules', models.JSONField(blank=True, default=dict)),
                        ('interjection_classifier', models.CharField(default='model', max_length=16)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('agent', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='versions', to='agents.agent')),
                        ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'runs_app_agentversion',
                        'ordering': ['agent', '-number'],
                    },
                ),
                migrations.AddField(
                    model_name='agent',
                    name='current_version',
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='agents.agentversion'),
                ),
                migrations.AddConstraint(
                    model_name='agentversion',
                    constraint=models.UniqueConstraint(fields=('agent', 'number'), name='agent_version_number_unique'),
                ),
                migrations.AddConstraint(
                    model_name='agentversion',
                    constraint=models.CheckConstraint(condition=models.Q(('number__gte', 1)), name='agent_version_number_positive'),
                ),
            ],
            database_operations=[
                content_types_moved(models=['agent', 'agentversion'], from_app="runs_app", to_app="agents"),
            ],
        ),
    ]
