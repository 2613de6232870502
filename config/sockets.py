"""Sockets, as the processes that hold hundreds of them look at them."""

import select


def readable(sock) -> bool:
    """Whether a socket (or a descriptor) has something to read, or was closed, right now: an idle
    connection kept for reuse has nothing to read unless its server closed it or sent something.
    poll, not select, which refuses descriptors above 1,024 — a worker process driving hundreds of
    runs holds that many sockets."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))
