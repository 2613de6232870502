"""`client.runs.iter()` follows the API's cursor pages: 250 runs come back exactly once each, in
the API's order (newest first), page after page, and the filters travel with every page."""

import httpx
import pytest

from django.utils import timezone

from runs_app.models import Run, RunStatus
from tests.support.factories import RunFactory, SessionFactory
from warden_client import Warden

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

# A session holds one active run at a time: the many runs of one session have ended.
ENDED = {"status": RunStatus.COMPLETED, "phase": "", "finished_at": timezone.now()}


def test_iterating_runs_follows_every_page_and_yields_each_of_250_runs_once_in_the_apis_order(
        procs, customer, customer_key):
    session = SessionFactory(owner=customer, title="many runs")
    RunFactory.create_batch(250, session=session, **ENDED)
    RunFactory(session=SessionFactory(owner=customer), **ENDED)  # another session: filtered out
    expected = [str(pk) for pk in Run.objects.filter(session=session).order_by("-created_at", "-id")
                .values_list("pk", flat=True)]
    procs.start_web()

    pages: list[httpx.Request] = []
    http = httpx.Client(base_url=procs.base_url, trust_env=False, event_hooks={"request": [pages.append]})
    with Warden(procs.base_url, customer_key, http_client=http) as client:
        runs = list(client.runs.iter(session=str(session.pk), limit=40))

    assert [run.id for run in runs] == expected
    assert len(set(expected)) == 250
    assert all(run.title == "many runs" and run.status == "completed" for run in runs)
    assert len(pages) == 7  # 6 full pages of 40 and one of 10
    assert all(request.url.params["session"] == str(session.pk) for request in pages)
    assert "cursor" not in pages[0].url.params and all("cursor" in request.url.params for request in pages[1:])
