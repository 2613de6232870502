"""The model context: a slice of the immutable history whose record (the step's manifest) does not
grow with the window (issue 16, goal 2), against PostgreSQL."""

import pytest
from django.db import transaction

from engine.context import context_build, manifest_covers, seq_ranges
from sessions_app.models import Message, MessageRole
from sessions_app.services import messages_append
from engine.actions.sessions import session_open
from tests.support.factories import UserFactory

pytestmark = pytest.mark.django_db


def _session_with(count: int):
    session = session_open(owner=UserFactory(), title="history")
    with transaction.atomic():
        messages_append(session_id=session.pk, messages=[
            Message(role=MessageRole.USER if i % 2 == 0 else MessageRole.ASSISTANT, content=f"message number {i}")
            for i in range(count)
        ])
    return session


def test_seq_ranges_fold_consecutive_seqs_and_continue_earlier_ranges():
    assert seq_ranges([]) == []
    assert seq_ranges([3, 4, 5, 9, 10, 12]) == [[3, 5], [9, 10], [12, 12]]
    before = [[1, 4]]
    assert seq_ranges([5, 6], after=before) == [[1, 6]]
    assert seq_ranges([8], after=before) == [[1, 4], [8, 8]]
    assert before == [[1, 4]]  # the earlier ranges are left as they were


@pytest.mark.parametrize("count", [10, 3000])
def test_the_manifest_names_the_messages_shown_as_one_range_whatever_the_window_holds(count):
    session = _session_with(count)
    built = context_build(session_id=session.pk, window_tokens=4000)
    shown = [m for m in built.messages if m["role"] != "system"]
    ((first, last),) = built.manifest["message_seq_ranges"]
    assert last == count and last - first + 1 == len(shown)  # the newest messages, every one of them
    assert [m["content"] for m in shown] == [f"message number {seq - 1}" for seq in range(first, last + 1)]
    assert manifest_covers(built.manifest, last) and not manifest_covers(built.manifest, first - 1)
    if count > 10:
        assert first > 1  # the window did not hold everything, yet the record stayed two numbers
