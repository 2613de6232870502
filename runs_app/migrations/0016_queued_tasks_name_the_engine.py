"""Tasks that releases before the engine moved to `engine/` queued as `runs_app.tasks.*` (django-q2
rows not yet taken by a worker) are rewritten to name `engine.tasks.*`, so the shim module that
kept the old paths importable could go (the floor plan, issue 25). A row that cannot be read (its
signature made with another SECRET_KEY) is left as it is: its run is queued, and the sweeper
re-enqueues queued runs whose task is lost."""

from django.db import migrations

OLD_PREFIX = "runs_app.tasks."
NEW_PREFIX = "engine.tasks."


def queued_tasks_renamed(apps, schema_editor):
    from django_q.signing import BadSignature, SignedPackage  # the queue's own packing of a task

    OrmQ = apps.get_model("django_q", "OrmQ")
    for row in OrmQ.objects.using(schema_editor.connection.alias).all().iterator():
        try:
            task = SignedPackage.loads(row.payload)
        except BadSignature:
            continue
        func = task.get("func")
        if isinstance(func, str) and func.startswith(OLD_PREFIX):
            task["func"] = NEW_PREFIX + func[len(OLD_PREFIX):]
            OrmQ.objects.using(schema_editor.connection.alias).filter(pk=row.pk).update(
                payload=SignedPackage.dumps(task))


class Migration(migrations.Migration):

    dependencies = [
        ("runs_app", "0015_models_moved_out"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(queued_tasks_renamed, migrations.RunPython.noop)]
