"""Fault hooks for chaos tests: make a worker die or pause at a named dangerous moment, so
tests hit the windows that matter on purpose rather than by luck.

Active only when WARDEN_ALLOW_FAULTS is set (test settings); WARDEN_FAULT_POINTS lists
`point=action` pairs, action `die` (SIGKILL itself) or `pause:SECONDS`. Points:
  after_key_commit       write tool: idempotency key committed, downstream not yet called
  after_downstream_call  write tool: downstream answered, result not yet committed
  mid_model_stream       part of a model response received
  after_claim            lease taken, nothing done yet
  after_limits_checked   a turn's writes: limits read, the turn not yet committed (their locks held)
"""

import functools
import os
import signal
import time

from django.conf import settings

POINTS = ("after_key_commit", "after_downstream_call", "mid_model_stream", "after_claim", "after_limits_checked")


@functools.cache
def _configured() -> dict[str, str]:
    if not settings.WARDEN_ALLOW_FAULTS:
        return {}
    pairs = [item.split("=", 1) for item in settings.WARDEN_FAULT_POINTS.split(",") if "=" in item]
    return {point.strip(): action.strip() for point, action in pairs}


def fault_point(name: str) -> None:
    action = _configured().get(name)
    if not action:
        return
    if action == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action.startswith("pause:"):
        time.sleep(float(action.split(":", 1)[1]))
