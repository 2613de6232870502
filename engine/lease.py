"""A worker's side of its lease (SPEC §5): who it is, and the heartbeat thread that extends the
lease while it works. The claim, the renewal and every write conditional on the token are the
state module's (engine/state/leases.py), so a worker that stalls past its lease and wakes up finds
its writes refused.
"""

import logging
import os
import socket
import threading
import uuid

from django.conf import settings
from django.db import connection

from engine.state import Lease, lease_renew, step_streamed_text_save

logger = logging.getLogger("warden.lease")


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Heartbeat(threading.Thread):
    """Extends the lease every WARDEN_HEARTBEAT_SECONDS while the worker works, and reports
    what it learns: the lease is gone, or a cancel was requested."""

    def __init__(self, lease: Lease):
        super().__init__(name=f"heartbeat-{lease.run_id}", daemon=True)
        self.lease = lease
        self.lease_lost = threading.Event()
        self.cancel_requested = threading.Event()
        self._stop = threading.Event()
        self._streaming: tuple[int, object] | None = None

    def streaming(self, *, step_id: int | None, text_getter) -> None:
        """While a model streams, each beat also saves the text so far on the step."""
        self._streaming = (step_id, text_getter) if step_id is not None else None

    def run(self) -> None:
        try:
            while not self._stop.wait(settings.WARDEN_HEARTBEAT_SECONDS):
                if not self.beat():
                    break
        finally:
            connection.close()

    def beat(self) -> bool:
        try:
            held, cancel_requested = lease_renew(lease=self.lease)
        except Exception:  # a dropped connection: try again next beat; the lease may still hold
            logger.warning("heartbeat for run %s failed", self.lease.run_id, exc_info=True)
            connection.close()
            return True
        if not held:
            self.lease_lost.set()
            return False
        if cancel_requested:
            self.cancel_requested.set()
        streaming = self._streaming
        if streaming is not None:
            step_id, text_getter = streaming
            step_streamed_text_save(step_id=step_id, lease_token=self.lease.token, text=text_getter())
        return True

    def stop(self) -> None:
        self._stop.set()
