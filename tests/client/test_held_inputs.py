"""The client's way to the held-input choice (POST /sessions/{id}/held-inputs/{input_id}/send and
/drop) against a real web server: the session detail lists held input, sending it starts a run,
and a second choice is the typed conflict."""

import asyncio

import pytest

from warden_client import AsyncWarden, Warden
from warden_client.errors import ConflictError

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def _held(client, title: str):
    session = client.sessions.create(title=title)
    run = client.sessions.say(session.id, "refund order 9527").run
    client.sessions.say(session.id, "and 9528 too", mode="supplement")
    client.runs.cancel(run.id)  # queued: cancelled at once, the supplement held for its user
    (held,) = client.sessions.get(session.id).held_inputs
    assert (held.content, held.disposition, held.held_from_run_id) == ("and 9528 too", "held", run.id)
    return session, run, held


def test_held_input_is_sent_once_or_dropped_through_the_client(procs, customer_key):
    procs.start_web()
    with Warden(procs.base_url, customer_key) as client:
        session, cancelled, held = _held(client, "send")
        posted = client.sessions.send_held(session.id, held.id)
        assert posted.disposition == "started_run" and posted.run.id != cancelled.id
        assert posted.message.content == "and 9528 too"
        with pytest.raises(ConflictError) as refused:
            client.sessions.drop_held(session.id, held.id)
        assert refused.value.code == "input_not_held"
        assert client.sessions.get(session.id).held_inputs == []

        other, _, kept = _held(client, "drop")
    dropped = asyncio.run(_drop(procs.base_url, customer_key, other.id, kept.id))  # the async client's way
    assert (dropped.id, dropped.disposition) == (kept.id, "discarded")


async def _drop(base_url: str, key: str, session_id: str, input_id: int):
    async with AsyncWarden(base_url, key) as client:
        return await client.sessions.drop_held(session_id, input_id)
