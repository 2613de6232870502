"""The queue's task paths: new tasks name `engine.tasks.*`, the sweeper's schedule was moved there
by a migration, and rows queued by releases before the move (`runs_app.tasks.*`) are rewritten to
name it (runs_app migration 0016)."""

from importlib import import_module

import pytest
from django.utils import timezone
from django.utils.module_loading import import_string
from django_q.models import Schedule

from engine import tasks
from engine.queue import ADVANCE_RUN_TASK, SWEEP_TASK

pytestmark = pytest.mark.django_db


def test_the_sweeper_schedule_names_the_engines_task():
    from django.apps import apps
    from django.db import connection

    # The schedule is a row the migrations made. A transactional test that ran before this one in the
    # same process flushed every table; the two migrations that make it then run again, in order.
    if not Schedule.objects.filter(name="warden-sweeper").exists():
        import_module("runs_app.migrations.0003_sweeper_schedule").create_schedule(apps, connection.schema_editor())
        import_module("runs_app.migrations.0007_sweeper_schedule_engine_path").to_engine(apps, connection.schema_editor())
    assert Schedule.objects.get(name="warden-sweeper").func == SWEEP_TASK == "engine.tasks.sweep"


def test_the_task_paths_resolve_to_the_engines_entry_points():
    assert import_string(ADVANCE_RUN_TASK) is tasks.advance_run
    assert import_string(SWEEP_TASK) is tasks.sweep


def test_rows_queued_under_the_earlier_paths_are_rewritten_to_the_engines():
    from django.apps import apps
    from django.db import connection
    from django_q.models import OrmQ
    from django_q.signing import SignedPackage

    migration = import_module("runs_app.migrations.0016_queued_tasks_name_the_engine")
    old = OrmQ.objects.create(key="warden", payload=SignedPackage.dumps(
        {"id": "a", "func": "runs_app.tasks.advance_run", "args": ("run-1",), "kwargs": {}}), lock=timezone.now())
    new = OrmQ.objects.create(key="warden", payload=SignedPackage.dumps(
        {"id": "b", "func": "engine.tasks.sweep", "args": (), "kwargs": {}}), lock=timezone.now())
    migration.queued_tasks_renamed(apps, connection.schema_editor())
    old.refresh_from_db(), new.refresh_from_db()
    assert SignedPackage.loads(old.payload) == {"id": "a", "func": "engine.tasks.advance_run", "args": ("run-1",), "kwargs": {}}
    assert SignedPackage.loads(new.payload)["func"] == "engine.tasks.sweep"
    assert import_string(SignedPackage.loads(old.payload)["func"]) is tasks.advance_run


@pytest.mark.django_db(transaction=True)  # a task manages its own connection, as in a worker
def test_a_task_for_a_run_that_is_not_claimable_is_a_harmless_no_op():
    from tests.support.factories import RunFactory

    run = RunFactory(status="completed", phase="", finished_at="2026-01-01T00:00:00Z")
    assert tasks.advance_run(str(run.id)) == "not-claimable"
