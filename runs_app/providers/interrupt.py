"""Closing a model call from another thread (issue 34): a worker process drives many runs, each in
a thread of its own, and a run's cancel is noticed by the process's lease keeper, not by the thread
blocked in the call. A blocked socket read does not wake when another thread closes the socket,
but it does when the socket is shut down — so each call's socket is attached to its run's
`CallInterrupt` as it is used, and `abort()` shuts it down: the read fails at once, the provider
sees a broken stream, and the run's own thread goes on to record the cancel.

Attaching happens on every write and read of an HTTP connection (`AbortableBackend`), in the
thread that uses it, so a keep-alive connection handed from one run to another follows its
current user. A run detaches before its connection goes back to the pool, so a late abort never
reaches a connection another run is using.
"""

import socket
import threading
import time
from contextlib import contextmanager

import httpcore
from django.conf import settings

from runs_app.providers.base import TransientModelError

_local = threading.local()


class CallInterrupt:
    """One run's interrupt: aborted once, for good (a cancelled or lost run makes no more calls)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self.aborted = threading.Event()

    def attach(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._socket = sock
            if self.aborted.is_set():
                _shutdown(sock)

    def detach(self) -> None:
        with self._lock:
            self._socket = None

    def abort(self) -> None:
        with self._lock:
            self.aborted.set()
            if self._socket is not None:
                _shutdown(self._socket)

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`, waking at once when aborted (True then)."""
        return self.aborted.wait(seconds)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed or never connected: nothing left to wake


def current_interrupt() -> CallInterrupt | None:
    return getattr(_local, "interrupt", None)


@contextmanager
def interruptible(interrupt: CallInterrupt | None):
    """Calls made by this thread inside the block can be aborted through `interrupt`."""
    previous = current_interrupt()
    _local.interrupt = interrupt
    try:
        yield interrupt
    finally:
        if interrupt is not None:
            interrupt.detach()
        _local.interrupt = previous


class _AbortableStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream):
        self._stream = stream
        self._socket = stream.get_extra_info("socket")

    def _attach(self) -> None:
        interrupt = current_interrupt()
        if interrupt is not None:
            interrupt.attach(self._socket)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._attach()
        return self._stream.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._attach()
        self._stream.write(buffer, timeout)

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        return _AbortableStream(self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str):
        return self._stream.get_extra_info(info)


class AbortableBackend(httpcore.SyncBackend):
    """httpcore's own network backend, whose streams attach their socket to the calling thread's
    interrupt before each read and write."""

    def connect_tcp(self, *args, **kwargs) -> httpcore.NetworkStream:
        return _AbortableStream(super().connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args, **kwargs) -> httpcore.NetworkStream:
        return _AbortableStream(super().connect_unix_socket(*args, **kwargs))


_endpoints: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_endpoints_lock = threading.Lock()


@contextmanager
def endpoint_slot(endpoint: str, *, timeout: float, limit: int | None = None):
    """At most `limit` (default WARDEN_MODEL_CONCURRENCY_PER_ENDPOINT; a model endpoint's own
    max_concurrency) calls to one model endpoint at once in this process: a slow or hung endpoint
    holds its own slots, never every run of the process. A call that finds no slot within its
    timeout is a transient error (asked again after a backoff); an aborted run stops waiting at
    once. A changed limit takes effect with the next call (calls under the old one finish there)."""
    limit = max(1, limit or settings.WARDEN_MODEL_CONCURRENCY_PER_ENDPOINT)
    with _endpoints_lock:
        slots = _endpoints.get((endpoint, limit))
        if slots is None:
            slots = _endpoints[(endpoint, limit)] = threading.BoundedSemaphore(limit)
    interrupt = current_interrupt()
    ends = time.monotonic() + timeout
    while not slots.acquire(timeout=0.25):
        if interrupt is not None and interrupt.aborted.is_set():
            raise TransientModelError("call aborted while waiting for a free slot of the model endpoint")
        if time.monotonic() >= ends:
            raise TransientModelError(f"the model endpoint's {limit} concurrent calls were all busy for {timeout:g} s")
    try:
        yield
    finally:
        slots.release()
