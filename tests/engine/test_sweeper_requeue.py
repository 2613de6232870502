"""The sweeper asks again for queued runs whose task may have been lost (a process died between
its commit and its enqueue) — but not while the broker still holds as many untaken tasks as there
are queued runs: an overloaded fleet's queue then grew by a task per waiting run every sweep."""

from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.models import OrmQ

from engine.sweeper import sweep_once
from runs_app.models import Run, RunStatus
from tests.support.factories import RunFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _stale(run_ids) -> None:
    Run.objects.filter(pk__in=run_ids).update(updated_at=timezone.now() - timedelta(minutes=5))


def test_queued_runs_are_asked_for_again_only_when_the_queue_cannot_hold_their_tasks():
    OrmQ.objects.all().delete()
    run_ids = [RunFactory(status=RunStatus.QUEUED).pk for _ in range(3)]
    _stale(run_ids)

    # Nothing in the queue: every stale queued run is announced.
    assert sweep_once()["requeued"] == 3
    assert OrmQ.objects.count() == 3

    # Their tasks wait in the queue: the runs wait for a worker, and nothing is added.
    _stale(run_ids)
    assert sweep_once()["requeued"] == 0
    assert OrmQ.objects.count() == 3

    # One task lost (taken by a process that died): the queue holds fewer than the runs, all are asked for.
    OrmQ.objects.filter(pk=OrmQ.objects.order_by("pk").first().pk).delete()
    assert sweep_once()["requeued"] == 3
    assert OrmQ.objects.count() == 5
