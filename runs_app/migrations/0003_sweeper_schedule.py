"""The sweeper runs as a django-q2 schedule (every minute) in every deployment; `make run` and
tests also run `manage.py sweep --loop` for second-level recovery."""

from django.db import migrations


def create_schedule(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.update_or_create(
        name="warden-sweeper",
        defaults={"func": "runs_app.tasks.sweep", "schedule_type": "I", "minutes": 1, "repeats": -1},
    )


def drop_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name="warden-sweeper").delete()


class Migration(migrations.Migration):
    dependencies = [("runs_app", "0002_initial"), ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more")]

    operations = [migrations.RunPython(create_schedule, drop_schedule)]
