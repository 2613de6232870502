"""Issue 34: a worker process drives many runs, and a slow or hung model endpoint must not take
every one of them — at most WARDEN_MODEL_CONCURRENCY_PER_ENDPOINT calls to one endpoint at once;
one more waits for a slot within its timeout (then a transient error: asked again after a
backoff), and stops waiting at once when its run is cancelled. Against a local server speaking
the Chat Completions wire format, holding its answers open."""

import threading

import pytest
from django.test import override_settings

from runs_app.providers.base import ModelRequest, TextDelta, TransientModelError
from runs_app.providers.interrupt import CallInterrupt, interruptible
from runs_app.providers.openai import OpenAIProvider
from tests.support.fake_openai_server import FakeOpenAIServer, Outcome
from tests.support.processes import wait_for

MESSAGES = [{"role": "user", "content": "the weather in Lisbon?"}]


@pytest.fixture
def held():
    """A server whose answers wait until released; one endpoint per test (slots are per endpoint)."""
    with FakeOpenAIServer() as fake, override_settings(OPENAI_BASE_URL=fake.base_url,
                                                      WARDEN_MODEL_CONCURRENCY_PER_ENDPOINT=1):
        yield fake
        fake.release_held()


def _call(timeout: float) -> list:
    return list(OpenAIProvider().stream(ModelRequest(messages=MESSAGES, options={"timeout": timeout})))


def _hold_the_only_slot(server) -> threading.Thread:
    server.enqueue(text=["sunny"], finish="stop", chunk_delay=600)
    got = []

    def hold() -> None:
        try:
            got.extend(_call(900))
        except TransientModelError as error:  # the server stopped at the end of the test
            got.append(error)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    wait_for(lambda: server.in_flight() == 1, timeout=30, message="the first call to hold the endpoint's slot")
    holder.got = got
    return holder


def test_a_call_past_the_endpoints_limit_waits_for_a_slot_then_is_a_transient_error(held):
    holder = _hold_the_only_slot(held)

    with pytest.raises(TransientModelError, match="concurrent calls were all busy"):
        _call(0.5)
    assert len(held.requests) == 1  # the second call never reached the server

    held.release_held()
    holder.join(timeout=30)
    assert holder.got and holder.got[0] == TextDelta("sunny")
    held.enqueue(text=["cloudy"], finish="stop")
    assert _call(5)[0] == TextDelta("cloudy")  # the slot is free again


def _interruptible_call(interrupt: CallInterrupt) -> tuple[threading.Thread, list[str]]:
    """A call made in a thread of its own under `interrupt`; its transient errors are collected."""
    failed: list[str] = []

    def call() -> None:
        with interruptible(interrupt):
            try:
                _call(900)
            except TransientModelError as error:
                failed.append(str(error))

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread, failed


def test_a_cancelled_run_stops_waiting_for_a_slot_at_once(held):
    _hold_the_only_slot(held)
    interrupt = CallInterrupt()
    waiter, failed = _interruptible_call(interrupt)
    interrupt.abort()
    waiter.join(timeout=30)
    assert failed and "aborted while waiting" in failed[0]
    assert len(held.requests) == 1


def test_an_abort_closes_its_calls_open_stream(held):
    held.enqueue(text=["sunny"], finish="stop", chunk_delay=600)
    interrupt = CallInterrupt()
    caller, failed = _interruptible_call(interrupt)
    wait_for(lambda: held.in_flight() == 1, timeout=30, message="the call to be in flight")
    interrupt.abort()
    caller.join(timeout=30)
    assert failed  # the blocked read woke up with the socket shut down
    assert held.wait_for_outcome(0, timeout=30) == Outcome.CLIENT_DISCONNECTED
