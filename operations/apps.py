from django.apps import AppConfig

from config.tracing import tracing_setup


class OperationsConfig(AppConfig):
    name = "operations"
    verbose_name = "Operations"

    def ready(self):
        from django_q.signals import post_spawn  # it imports django_q's models

        from operations import liveness  # it imports the models, which exist only once apps are ready

        # Every django-q2 worker process records its heartbeat (docs/OPERATIONS.md).
        post_spawn.connect(liveness.on_worker_spawn, dispatch_uid="warden-worker-heartbeat")
        # OpenTelemetry, when the OTEL_* variables ask for it: before any request handler loads
        # the middleware the Django instrumentation adds.
        tracing_setup()
