"""The event types are one enum, and docs/EVENTS.md documents each of them (the SSE and websocket
contract). The whole suite also checks every event its runs emit against the document
(tests/support/plugin.py); here: the document and the enum agree, and nothing else can be written."""

import pytest
from django.db import transaction

from runs_app.events import RunEventType
from runs_app.models import RunEvent
from engine.state import run_write
from tests.support.factories import RunFactory
from tests.support.event_contract import documented, undocumented

pytestmark = pytest.mark.django_db


def test_every_event_type_is_documented_and_nothing_else_is():
    assert set(documented()) == set(RunEventType.values)


def test_every_documented_type_lists_its_payload_fields():
    assert all(fields for fields in documented().values())


def test_run_write_refuses_a_type_outside_the_contract_and_writes_nothing():
    run = RunFactory()
    with pytest.raises(ValueError), transaction.atomic():
        run_write(run_id=run.id, events=[("note", {"n": 1})])
    assert not RunEvent.objects.filter(run=run).exists()


def test_the_checker_names_an_undocumented_type_and_field():
    problems = undocumented({"run_status": {"status", "mood"}, "note": set()})
    assert problems == [
        "event type 'note' is emitted but not documented",
        "event 'run_status' carries payload field 'mood', which is not documented",
    ]
