"""`AsyncWarden` against a real server: the same calls as the sync client, awaited — a session made
and spoken in, runs iterated across pages, an ended run's events streamed to its `end`, a refusal
raised with its code."""

import asyncio

import pytest

from runs_app.models import Run, RunEvent
from tests.support.api import build_world
from warden_client import AsyncWarden, NotFoundError

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_the_async_client_speaks_to_a_live_server(procs, customer, customer_key):
    world = build_world(customer)
    procs.start_web()

    async def scenario():
        async with AsyncWarden(procs.base_url, customer_key, trust_env=False) as client:
            session = await client.sessions.create(title="async")
            posted = await client.sessions.say(session.id, "Where is order 4411?")
            runs = [run.id async for run in client.runs.iter(limit=2)]
            events = [event async for event in client.runs.stream(str(world.run.pk))]
            messages = [message.content async for message in client.sessions.messages(str(world.session.pk))]
            with pytest.raises(NotFoundError) as missing:
                await client.sessions.get("00000000-0000-0000-0000-000000000000")
            return posted, runs, events, messages, missing.value

    posted, runs, events, messages, missing = asyncio.run(scenario())
    assert posted.disposition == "started_run" and runs[0] == posted.run.id
    assert runs == [str(pk) for pk in Run.objects.filter(session__owner=customer).order_by("-created_at", "-id")
                    .values_list("pk", flat=True)]
    assert len(runs) == 5  # the world's four and the new one, two to a page
    assert [(event.seq, event.type) for event in events] == list(
        RunEvent.objects.filter(run=world.run).order_by("seq").values_list("seq", "type"))
    assert messages == ["refund order 9527", "Done: refunded."]
    assert (missing.code, missing.status) == ("not_found", 404)
