"""Two transitions of one run from two database connections at once: exactly one wins."""

import threading

import pytest
from django.db import connection
from django.utils import timezone

from runs_app.models import Run, RunEvent, RunPhase, RunStatus
from engine.state import run_transition
from tests.support.factories import RunFactory


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(5))
def test_two_connections_racing_exactly_one_wins(attempt):
    run = RunFactory()
    barrier = threading.Barrier(2)
    results: dict[str, bool] = {}

    def contender(name: str, to: str, extra: dict) -> None:
        try:
            stale = Run.objects.get(pk=run.pk)  # both read `queued`
            barrier.wait()
            results[name] = run_transition(run=stale, to=to, **extra)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=contender, args=("cancel", RunStatus.CANCELLED, {})),
        threading.Thread(
            target=contender,
            args=(
                "claim",
                RunStatus.RUNNING,
                {"phase": RunPhase.PREPARING_CONTEXT, "lease_owner": "w1", "lease_expires_at": timezone.now()},
            ),
        ),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(results.values()) == [False, True]
    winner = next(name for name, won in results.items() if won)
    stored = Run.objects.get(pk=run.pk)
    assert stored.status == {"cancel": RunStatus.CANCELLED, "claim": RunStatus.RUNNING}[winner]
    assert RunEvent.objects.filter(run=run).count() == 1
