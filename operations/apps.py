import os

from django.apps import AppConfig

from config.tracing import tracing_setup

# Connection pools a forked child inherited from its parent: kept referenced, never used or closed
# (closing would end the parent's connections, whose sockets the child shares).
_inherited_pools: list = []


def _forget_inherited_pools() -> None:
    """In a forked child (django-q2's workers, pusher and monitor): the parent's connection pools
    are the parent's. Dropped before the child's first query, so it opens a pool of its own."""
    from django.db.backends.postgresql.base import DatabaseWrapper

    _inherited_pools.extend(DatabaseWrapper._connection_pools.values())
    DatabaseWrapper._connection_pools.clear()


class OperationsConfig(AppConfig):
    name = "operations"
    verbose_name = "Operations"

    def ready(self):
        from django_q.signals import post_spawn  # it imports django_q's models

        from operations import liveness  # it imports the models, which exist only once apps are ready

        # Every django-q2 worker process records its heartbeat (docs/OPERATIONS.md).
        post_spawn.connect(liveness.on_worker_spawn, dispatch_uid="warden-worker-heartbeat")
        os.register_at_fork(after_in_child=_forget_inherited_pools)
        # OpenTelemetry, when the OTEL_* variables ask for it: before any request handler loads
        # the middleware the Django instrumentation adds.
        tracing_setup()
