"""A console client in Python: the websocket protocol of console.consumer, as a test
drives it, and the offset reconciliation console.js applies to streamed text."""

import json
import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from django.db import connection
from django.test import Client
from websockets.sync.client import connect

from tests.support.processes import ProcessGroup

# A bound on a hung test, never an assertion about speed.
RECEIVE_TIMEOUT = 60



def _redis_test_url() -> str:
    """The Redis of REDIS_URL (the Redis-marked tests run only when it is set), in a database of its
    own (13), so these tests never read a colleague's messages; WARDEN_TEST_REDIS_URL overrides."""
    if os.environ.get("WARDEN_TEST_REDIS_URL"):
        return os.environ["WARDEN_TEST_REDIS_URL"]
    parts = urlsplit(os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0")
    return urlunsplit(parts._replace(path="/13"))


REDIS_TEST_URL = _redis_test_url()


def postgres_layer_for_test_db() -> dict:
    settings_dict = connection.settings_dict
    return {
        "default": {
            "BACKEND": "config.channel_layers.PostgresChannelLayer",
            "CONFIG": {**{k: settings_dict[k] for k in ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT")}, "TIME_ZONE": None},
        }
    }


def require_redis() -> None:
    """The tests that call this carry the `redis` marker: without REDIS_URL (a fresh laptop, the
    README's `make test`) they are deselected before they start (tests/support/plugin.py). Selected,
    they need the Redis it names: a Redis that does not answer fails them, never skips them."""
    import pytest
    import redis

    client = redis.Redis.from_url(REDIS_TEST_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.exceptions.RedisError as error:
        pytest.fail(f"no Redis at {REDIS_TEST_URL} ({error}): a test marked `redis` needs the Redis REDIS_URL names")
    finally:
        client.close()


def redis_layer() -> dict:
    return {
        "default": {
            "BACKEND": "config.channel_layers.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_TEST_URL]},
        }
    }


def postgres_layer_pool_drop() -> None:
    """channels_postgres keeps one connection pool per process, whatever database a layer
    names. Close it (on the loop this process publishes from, where it was opened), so the
    next layer connects to its own database and the test database can be dropped at the end."""
    import asyncio

    from channels_postgres import db as layer_db

    from runs_app.live import _publisher_loop

    pool, layer_db.connection_pool = layer_db.connection_pool, None
    if pool is None:
        return
    try:
        asyncio.run_coroutine_threadsafe(pool.close(timeout=2), _publisher_loop()).result(timeout=5)
    except Exception:  # noqa: BLE001 - opened on another loop: close its sockets directly
        for conn in list(getattr(pool, "_pool", ())):
            conn.pgconn.finish()


def session_cookie(user) -> str:
    """The Cookie header of a browser in which `user` has logged in (a real Django session row)."""
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def ws_url(procs: ProcessGroup, path: str = "/ws/console/") -> str:
    return procs.base_url.replace("http://", "ws://") + path


def open_socket(procs: ProcessGroup, *, user=None, cookie: str | None = None, origin: str | None = None,
                path: str = "/ws/console/"):
    cookie = cookie or (session_cookie(user) if user is not None else None)
    headers = {"Cookie": cookie} if cookie else {}
    return connect(
        ws_url(procs, path), origin=origin if origin is not None else procs.base_url, additional_headers=headers,
        proxy=None, open_timeout=30, legacy=True,
    )


@dataclass
class StreamedText:
    """console.js's reconciliation: each text delta starts at a character offset; what is
    already shown is skipped, a piece past the end waits for the gap to fill, `so_far` (the
    whole text so far) repairs any gap."""

    text: str = ""
    stash: list[tuple[int, str]] = field(default_factory=list)

    def apply(self, *, offset: int, text: str, so_far: str | None = None) -> None:
        if so_far is not None and len(so_far) > len(self.text):
            assert so_far.startswith(self.text), (so_far, self.text)
            self.text = so_far
        else:
            self.stash.append((offset, text))
        progressed = True
        while progressed:
            progressed = False
            for piece in list(self.stash):
                start, chunk = piece
                if start + len(chunk) <= len(self.text):
                    self.stash.remove(piece)
                elif start <= len(self.text):
                    self.text += chunk[len(self.text) - start :]
                    self.stash.remove(piece)
                    progressed = True


class ConsoleSocket:
    """One connected console: sends actions, keeps every message it received, and tracks per
    run the seqs it saw and the text of each streamed step."""

    def __init__(self, connection):
        self.connection = connection
        self.received: list[dict] = []
        self.seqs: dict[str, list[int]] = {}
        self.event_types: dict[str, list[str]] = {}
        self.texts: dict[tuple[str, int], StreamedText] = {}
        self.final_texts: dict[tuple[str, int], str] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.connection.close()

    def send(self, **payload) -> None:
        self.connection.send(json.dumps(payload))

    def subscribe(self, session_id, after: dict | None = None) -> dict:
        self.send(action="subscribe", session=str(session_id), after=after or {}, ref="sub")
        return self.until(lambda m: m.get("ref") == "sub" and m["type"] in ("subscribed", "error"))

    def receive(self) -> dict:
        message = json.loads(self.connection.recv(timeout=RECEIVE_TIMEOUT))
        self.received.append(message)
        run_id = message.get("run_id")
        if message["type"] == "events":
            for event in message["events"]:
                self.seqs.setdefault(run_id, []).append(event["seq"])
                self.event_types.setdefault(run_id, []).append(event["type"])
                payload = event["payload"]
                if event["type"] == "step_completed" and payload.get("kind") == "model":
                    self.final_texts[(run_id, payload["step"])] = payload.get("text", "")
        elif message["type"] == "delta" and message["delta"]["kind"] == "text_delta":
            delta = message["delta"]
            self.texts.setdefault((run_id, delta["step"]), StreamedText()).apply(
                offset=delta["offset"], text=delta["text"], so_far=delta.get("so_far")
            )
        elif message["type"] == "stream":
            self.texts.setdefault((run_id, message["step"]), StreamedText()).apply(offset=0, text=message["text"])
        return message

    def until(self, predicate) -> dict:
        """Receive until a message satisfies `predicate`; return that message."""
        while True:
            message = self.receive()
            if predicate(message):
                return message

    def until_run_status(self, run_id, statuses: set[str]) -> dict:
        def reached(message):
            return message["type"] == "events" and message["run_id"] == str(run_id) and any(
                e["type"] == "run_status" and e["payload"]["status"] in statuses for e in message["events"]
            )

        return self.until(reached)

    def statuses(self, run_id) -> list[str]:
        return [
            e["payload"]["status"]
            for m in self.received
            if m["type"] == "events" and m["run_id"] == str(run_id)
            for e in m["events"]
            if e["type"] == "run_status"
        ]
