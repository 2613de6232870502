"""The task paths of earlier releases, kept so that queued django-q2 rows written before the
engine moved to `engine/` still run. An entry point like a management command (an interface):
new tasks are enqueued as `engine.tasks.*` (engine/queue.py)."""

from engine.tasks import advance_run, sweep

__all__ = ["advance_run", "sweep"]
