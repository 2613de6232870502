"""The queue's task paths: new tasks name `engine.tasks.*`, the sweeper's schedule was moved there
by a migration, and rows queued by releases before the move (`runs_app.tasks.*`) still resolve."""

import pytest
from django.utils.module_loading import import_string
from django_q.models import Schedule

from engine import tasks
from engine.queue import ADVANCE_RUN_TASK, SWEEP_TASK

pytestmark = pytest.mark.django_db


def test_the_sweeper_schedule_names_the_engines_task():
    assert Schedule.objects.get(name="warden-sweeper").func == SWEEP_TASK == "engine.tasks.sweep"


def test_new_and_earlier_task_paths_resolve_to_the_same_entry_points():
    assert import_string(ADVANCE_RUN_TASK) is tasks.advance_run
    assert import_string(SWEEP_TASK) is tasks.sweep
    assert import_string("runs_app.tasks.advance_run") is tasks.advance_run
    assert import_string("runs_app.tasks.sweep") is tasks.sweep


@pytest.mark.django_db(transaction=True)  # a task manages its own connection, as in a worker
def test_a_task_for_a_run_that_is_not_claimable_is_a_harmless_no_op():
    from tests.factories import RunFactory

    run = RunFactory(status="completed", phase="", finished_at="2026-01-01T00:00:00Z")
    assert tasks.advance_run(str(run.id)) == "not-claimable"
