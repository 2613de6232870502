"""ProcessHeartbeat moves here from runs_app (the floor plan, issue 25): its table keeps its name and
rows; the content type follows."""

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
                    name='ProcessHeartbeat',
                    fields=[
                        ('identity', models.CharField(max_length=160, primary_key=True, serialize=False)),
                        ('role', models.CharField(choices=[('worker', 'Worker'), ('sweeper', 'Sweeper'), ('web', 'Web')], max_length=12)),
                        ('host', models.CharField(max_length=255)),
                        ('pid', models.PositiveIntegerField()),
                        ('cluster', models.CharField(blank=True, max_length=160)),
                        ('started_at', models.DateTimeField()),
                        ('beat_at', models.DateTimeField()),
                        ('counters', models.JSONField(blank=True, default=dict)),
                        ('gauges', models.JSONField(blank=True, default=dict)),
                    ],
                    options={
                        'db_table': 'runs_app_processheartbeat',
                        'ordering': ['role', '-beat_at'],
                        'indexes': [models.Index(fields=['role', '-beat_at'], name='process_heartbeat_fresh')],
                        'constraints': [models.CheckConstraint(condition=models.Q(('role__in', ['worker', 'sweeper', 'web'])), name='process_heartbeat_role_valid')],
                    },
                ),
            ],
            database_operations=[
                content_types_moved(models=['processheartbeat'], from_app="runs_app", to_app="operations"),
            ],
        ),
    ]
