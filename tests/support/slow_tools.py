"""Tools a test deployment registers (through WARDEN_TOOL_MODULES, like any deployment's): a
read and a write that overrun their declared timeout, for the run-time to enforce it."""

import threading

from pydantic import BaseModel

from tools_app.models import ToolEffect
from tools_app.registry import Reconciled, Tool, tool_register

DECLARED_TIMEOUT = 0.5
_attempts: dict[str, int] = {}
_lock = threading.Lock()
_never = threading.Event()  # nobody sets it: a call that waits on it hangs until its process ends


class KeyArguments(BaseModel):
    key: str


def slow_lookup(ctx, args: KeyArguments) -> dict:
    """Hangs on its first attempt for a key; answers at once on the next ones."""
    with _lock:
        _attempts[args.key] = attempt = _attempts.get(args.key, 0) + 1
    if attempt == 1:
        _never.wait()
    return {"key": args.key, "attempt": attempt}


def slow_write(ctx, args: KeyArguments) -> dict:
    """Hangs: whether it took effect is anybody's guess, as after a real timeout."""
    _never.wait()
    return {"key": args.key}


def slow_write_reconcile(ctx, args: KeyArguments) -> Reconciled:
    return Reconciled(applied=False, detail="the test downstream has no such request")


tool_register(Tool(name="slow_lookup", description="A lookup that hangs once.", arguments=KeyArguments,
                   effect=ToolEffect.READ, execute=slow_lookup, timeout=DECLARED_TIMEOUT, max_attempts=3, retry_backoff=0.05))
tool_register(Tool(name="slow_write", description="A write that hangs.", arguments=KeyArguments,
                   effect=ToolEffect.WRITE, execute=slow_write, timeout=DECLARED_TIMEOUT, reconcile=slow_write_reconcile))
