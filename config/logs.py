"""Log lines that say which run they are about (docs/OPERATIONS.md, "Logs").

The engine binds the ids it works on (run, session, tool call, lease token) to a context variable
(`log_context`); every record logged meanwhile, by any logger, carries them — as JSON fields with
`WARDEN_LOG_FORMAT=json` (the default), as a `[run=… …]` prefix with `plain`. Context variables
follow threads started with `contextvars.copy_context()` and asyncio tasks, so concurrent reads
of one batch keep their own tool_call_id.
"""

import contextlib
import contextvars
import json
import logging
from datetime import datetime, timezone

from opentelemetry import trace

# The fields a record may carry from the context, in the order the plain format shows them.
CONTEXT_FIELDS = ("run_id", "session_id", "step", "tool_call_id", "lease_token", "worker", "request_id")

_context: contextvars.ContextVar[dict] = contextvars.ContextVar("warden_log_context", default={})


@contextlib.contextmanager
def log_context(**fields):
    """Bind `fields` (None values are skipped) to every record logged inside the block."""
    token = _context.set({**_context.get(), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def current_log_context() -> dict:
    return dict(_context.get())


class RunContextFilter(logging.Filter):
    """Copies the bound fields onto the record (`record.run_id`, …) and renders them for the plain
    format as `record.run_context`."""

    def filter(self, record: logging.LogRecord) -> bool:
        bound = _context.get()
        for name in CONTEXT_FIELDS:
            if name in bound and not hasattr(record, name):
                setattr(record, name, bound[name])
        shown = [f"{name}={getattr(record, name)}" for name in CONTEXT_FIELDS if hasattr(record, name)]
        record.run_context = f"[{' '.join(shown)}] " if shown else ""
        return True


# LogRecord's own attributes: everything else on a record was passed as `extra=` and is logged.
_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "run_context"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, process, the bound
    run context, any `extra=` fields, the OpenTelemetry trace and span ids when tracing, and the
    exception text."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.threadName,
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                line[key] = value
        trace_ids = _trace_ids()
        if trace_ids:
            line.update(trace_ids)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)


def _trace_ids() -> dict:
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}
