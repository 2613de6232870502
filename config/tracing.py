"""OpenTelemetry traces (docs/OPERATIONS.md, "Traces"): off unless the standard OTEL_* variables
ask for them (settings.WARDEN_TRACING). On, every process exports its spans through the SDK's
batch processor: Django requests and httpx calls (the instrumentations; psycopg's SQL statements
too with WARDEN_TRACE_SQL), and
the engine's own spans — a run's time slice, each model call, each tool call — tagged with the
run, session, step and tool-call ids and the lease token (`span`).

Off, `span` is a no-op context manager that costs one attribute lookup."""

import contextlib
import logging
import os

from django.conf import settings
from opentelemetry import trace

logger = logging.getLogger("warden.tracing")

_state = {"enabled": False, "pid": None}
_tracer = trace.get_tracer("warden")


def tracing_enabled() -> bool:
    return _state["enabled"]


def tracing_setup(*, exporter=None, batch: bool | None = None, sql: bool | None = None) -> bool:
    """Install the SDK's tracer provider and the instrumentations, once per process (again after
    a fork: django-q2 forks its workers, and a batch processor's thread does not survive that).
    `exporter` is for tests and the benchmark (exported synchronously unless `batch`); otherwise
    OTEL_TRACES_EXPORTER picks `otlp` (http/protobuf, the default when an endpoint is set) or
    `console`, behind the SDK's batch processor. A span per SQL statement (the psycopg
    instrumentation) only with `sql` (default: settings.WARDEN_TRACE_SQL): at ~11 statements per
    engine step they cost ~15 % of a step's time, the engine's own spans ~3 % (docs/BENCHMARKS.md)."""
    if _state["pid"] == os.getpid() and exporter is None:
        return _state["enabled"]
    _state["pid"] = os.getpid()
    if exporter is None and not settings.WARDEN_TRACING:
        _state["enabled"] = False
        return False
    from opentelemetry.sdk.resources import Resource  # the SDK is imported only when tracing is on
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "warden")}))
    if exporter is None:
        exporter, batch = _configured_exporter(), True
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    _set_provider(provider)
    _instrument(sql=settings.WARDEN_TRACE_SQL if sql is None else sql)
    _state["enabled"] = True
    return True


def tracing_reset() -> None:
    """Tests: back to no tracing; the instrumentations are removed again."""
    _state["enabled"] = False
    for instrumentor in _instrumentors():
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()


def _configured_exporter():
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")[0].strip().lower()
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, _HEADERS, _TIMEOUT


def _set_provider(provider) -> None:
    # The API lets a process set its global provider once; a forked child (or a test installing an
    # in-memory exporter) replaces it, so the engine's tracer is re-bound explicitly.
    global _tracer
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    else:
        trace._TRACER_PROVIDER = provider  # noqa: SLF001 - replacing after fork / in tests
    _tracer = provider.get_tracer("warden")


def _instrumentors() -> list:
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    return [DjangoInstrumentor(), PsycopgInstrumentor(), HTTPXClientInstrumentor()]  # singletons


def _instrument(*, sql: bool) -> None:
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    for instrumentor in _instrumentors():
        if isinstance(instrumentor, PsycopgInstrumentor) and not sql:
            if instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.uninstrument()
            continue
        if not instrumentor.is_instrumented_by_opentelemetry:
            try:
                instrumentor.instrument()
            except Exception:  # noqa: BLE001 - a missing instrumentation must not stop the process
                logger.warning("could not instrument with %s", type(instrumentor).__name__, exc_info=True)


@contextlib.contextmanager
def span(name: str, **attributes):
    """A span named `name` (child of the current one) with `warden.<key>` attributes; None values
    are left out. A no-op when tracing is off."""
    if not _state["enabled"]:
        yield None
        return
    with _tracer.start_as_current_span(name) as current:
        for key, value in attributes.items():
            if value is not None:
                current.set_attribute(f"warden.{key}", value if isinstance(value, (bool, int, float)) else str(value))
        yield current


def span_record(name: str, *, start, end, events=(), **attributes) -> None:
    """A finished span for something that happened across processes and time — a human decision,
    requested by a worker, decided hours later through the desk — recorded once it is over, with its
    real start and end (datetimes) and its milestones as span events (`(name, datetime)`; None
    moments are left out). Nothing stays open in between. A no-op when tracing is off."""
    if not _state["enabled"]:
        return
    current = _tracer.start_span(name, start_time=_nanoseconds(start))
    for key, value in attributes.items():
        if value is not None:
            current.set_attribute(f"warden.{key}", value if isinstance(value, (bool, int, float)) else str(value))
    for event, moment in events:
        if moment is not None:
            current.add_event(event, timestamp=_nanoseconds(moment))
    current.end(end_time=_nanoseconds(end))


def _nanoseconds(moment) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def span_set(current, **attributes) -> None:
    """Add attributes to a span `span()` returned (None when tracing is off)."""
    if current is None:
        return
    for key, value in attributes.items():
        if value is not None:
            current.set_attribute(f"warden.{key}", value if isinstance(value, (bool, int, float)) else str(value))
