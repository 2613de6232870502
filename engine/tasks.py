"""django-q2 task entry points. Every task is a harmless no-op when its run is not claimable,
because the run's lease — not the queue — decides who works."""

from engine.loop import run_drive
from engine.sweeper import sweep_once


def advance_run(run_id: str) -> str:
    return run_drive(run_id=run_id)


def sweep() -> dict:
    return sweep_once()
