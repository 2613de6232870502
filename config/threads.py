"""Synchronous work that may be asked for from an event loop (the console's consumer, an async view):
there Django refuses database queries and a second event loop cannot start, so the work runs in a
thread of its own, whose database connections are closed when it is done."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

from django.db import connections


def off_the_event_loop(function, *args):
    """`function(*args)`, here when this thread runs no event loop, else in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return function(*args)

    def in_thread():
        try:
            return function(*args)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="off-the-loop") as pool:
        return pool.submit(in_thread).result()
