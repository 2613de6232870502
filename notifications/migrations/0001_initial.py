"""The webhook outbox moves here from runs_app (the floor plan, issue 25): its tables keep their names
and rows; the content types follow, so permissions granted on them still hold."""

import django.contrib.postgres.fields
import django.db.models.deletion
import django.utils.timezone
import notifications.models
import uuid
from django.db import migrations, models

from config.migration_ops import content_types_moved


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('contenttypes', '0002_remove_content_type_name'),
        ('runs_app', '0014_fk_indexes_covered'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            # The tables stay as they are (the models name them with db_table): only Django's
            # state changes.
            state_operations=[
                migrations.CreateModel(
                    name='WebhookEndpoint',
                    fields=[
                        ('id', models.BigAutoField(primary_key=True, serialize=False)),
                        ('name', models.CharField(max_length=100)),
                        ('url', models.URLField(max_length=500)),
                        ('secret', models.CharField(default=notifications.models.webhook_secret_new, help_text='Standard Webhooks secret (whsec_…); receivers verify signatures with it.', max_length=100)),
                        ('kinds', django.contrib.postgres.fields.ArrayField(base_field=models.CharField(choices=[('approval.requested', 'An approval was requested'), ('approval.expiring', 'A pending approval is about to expire'), ('tool_call.needs_reconciliation', 'A write needs a person to reconcile it'), ('run.failed', 'A run failed'), ('run.completed', 'A run completed')], max_length=40), blank=True, default=list, size=None)),
                        ('active', models.BooleanField(default=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                    ],
                    options={
                        'db_table': 'runs_app_webhookendpoint',
                        'ordering': ['name', 'id'],
                        'constraints': [models.CheckConstraint(condition=models.Q(('secret__startswith', 'whsec_')), name='webhook_endpoint_secret_format')],
                    },
                ),
                migrations.CreateModel(
                    name='WebhookDelivery',
                    fields=[
                        ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ('kind', models.CharField(choices=[('approval.requested', 'An approval was requested'), ('approval.expiring', 'A pending approval is about to expire'), ('tool_call.needs_reconciliation', 'A write needs a person to reconcile it'), ('run.failed', 'A run failed'), ('run.completed', 'A run completed')], max_length=40)),
                        ('event_seq', models.PositiveBigIntegerField(blank=True, null=True)),
                        ('body', models.JSONField()),
                        ('status', models.CharField(choices=[('pending', 'Pending'), ('delivered', 'Delivered'), ('failed', 'Failed')], default='pending', max_length=12)),
                        ('attempts', models.PositiveIntegerField(default=0)),
                        ('next_attempt_at', models.DateTimeField(default=django.utils.timezone.now)),
                        ('claimed_by', models.CharField(blank=True, max_length=160)),
                        ('claimed_until', models.DateTimeField(blank=True, null=True)),
                        ('last_status_code', models.PositiveIntegerField(blank=True, null=True)),
                        ('last_error', models.CharField(blank=True, max_length=500)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('delivered_at', models.DateTimeField(blank=True, null=True)),
                        ('run', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='runs_app.run')),
                        ('endpoint', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='deliveries', to='notifications.webhookendpoint')),
                    ],
                    options={
                        'verbose_name_plural': 'webhook deliveries',
                        'db_table': 'runs_app_webhookdelivery',
                        'ordering': ['-created_at'],
                    },
                ),
                migrations.CreateModel(
                    name='WebhookAttempt',
                    fields=[
                        ('id', models.BigAutoField(primary_key=True, serialize=False)),
                        ('number', models.PositiveIntegerField()),
                        ('deliverer', models.CharField(max_length=160)),
                        ('started_at', models.DateTimeField()),
                        ('finished_at', models.DateTimeField(blank=True, null=True)),
                        ('status_code', models.PositiveIntegerField(blank=True, null=True)),
                        ('error', models.CharField(blank=True, max_length=500)),
                        ('response_excerpt', models.CharField(blank=True, max_length=500)),
                        ('delivery', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='attempt_log', to='notifications.webhookdelivery')),
                    ],
                    options={
                        'db_table': 'runs_app_webhookattempt',
                        'ordering': ['delivery', 'number'],
                        'constraints': [models.UniqueConstraint(fields=('delivery', 'number'), name='webhook_attempt_number_unique')],
                    },
                ),
                migrations.AddIndex(
                    model_name='webhookdelivery',
                    index=models.Index(condition=models.Q(('status', 'pending')), fields=['next_attempt_at'], name='webhook_delivery_due'),
                ),
                migrations.AddConstraint(
                    model_name='webhookdelivery',
                    constraint=models.CheckConstraint(condition=models.Q(('status__in', ['pending', 'delivered', 'failed'])), name='webhook_delivery_status_valid'),
                ),
                migrations.AddConstraint(
                    model_name='webhookdelivery',
                    constraint=models.CheckConstraint(condition=models.Q(models.Q(('status', 'delivered'), _negated=True), ('delivered_at__isnull', False), _connector='OR'), name='webhook_delivery_delivered_has_time'),
                ),
                migrations.AddConstraint(
                    model_name='webhookdelivery',
                    constraint=models.UniqueConstraint(condition=models.Q(('event_seq__isnull', False)), fields=('endpoint', 'run', 'event_seq'), name='webhook_delivery_once_per_event'),
                ),
            ],
            database_operations=[
                content_types_moved(models=['webhookendpoint', 'webhookdelivery', 'webhookattempt'], from_app="runs_app", to_app="notifications"),
            ],
        ),
    ]
