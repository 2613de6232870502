"""A model provider for the tests whose summaries fail: configured by name in WARDEN_PROVIDERS,
as a deployment adds a vendor. It streams like the scripted model; its `summarize` raises the
errors queued in SUMMARY_FAULTS first ("transient" → 503, "permanent" → 400)."""

from runs_app.providers.base import PermanentModelError, TransientModelError
from demo.model import DemoModel

SUMMARY_FAULTS: list[str] = []


class FlakySummaryProvider(DemoModel):
    def summarize(self, *, previous, messages, max_tokens):
        if SUMMARY_FAULTS:
            fault = SUMMARY_FAULTS.pop(0)
            if fault == "transient":
                raise TransientModelError("summary: 503 Service Unavailable", status=503)
            raise PermanentModelError("summary: 400 Bad Request", status=400)
        return super().summarize(previous=previous, messages=messages, max_tokens=max_tokens)
