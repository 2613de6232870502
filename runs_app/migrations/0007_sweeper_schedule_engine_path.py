"""The engine moved to the top-level `engine` package: the sweeper's schedule names its new
task path (runs_app.tasks stays as a shim for rows queued before the move)."""

from django.db import migrations


def to_engine(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(func="runs_app.tasks.sweep").update(func="engine.tasks.sweep")


def to_runs_app(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(func="engine.tasks.sweep").update(func="runs_app.tasks.sweep")


class Migration(migrations.Migration):
    dependencies = [("runs_app", "0006_run_session_owner")]

    operations = [migrations.RunPython(to_engine, to_runs_app)]
