"""The client's SSE parser (warden_client.sse) reads an event stream as the WHATWG standard says,
however the bytes are cut into chunks; the stream state over it delivers each event once, stops at
`end` and raises at `error`."""

import json

import pytest

from warden_client import ReconnectPolicy, ServerSentEvent, SSEDecoder, StreamError
from warden_client._core import EventStreamState

STREAM = (
    "retry: 2000\n\n"
    ": keepalive\n\n"
    'id: 1\nevent: run_status\ndata: {"seq": 1, "type": "run_status", "payload": {"status": "queued"}, '
    '"created_at": "2026-01-01T00:00:00Z"}\n\n'
    "id: 2\nevent: note\ndata: first line\ndata:second line\ndata\n\n"
    'event: end\ndata: {"status": "completed"}\n\n'
)


def decode(chunks) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    events = []
    for chunk in chunks:
        events += decoder.feed_bytes(chunk)
    return events


def test_frames_are_read_with_their_id_type_and_data_and_comments_skipped():
    events = decode([STREAM.encode()])
    assert [(e.id, e.event) for e in events] == [("1", "run_status"), ("2", "note"), ("2", "end")]
    assert json.loads(events[0].data)["payload"] == {"status": "queued"}
    assert events[0].retry == 2000


def test_data_lines_join_with_newlines_and_one_space_after_the_colon_is_dropped():
    (event,) = decode([b"data:  two spaces\ndata:none\ndata\n\n"])
    assert event.data == " two spaces\nnone\n"
    assert event.event == "message" and event.id is None


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
def test_every_line_ending_gives_the_same_events(newline):
    assert decode([STREAM.replace("\n", newline).encode()]) == decode([STREAM.encode()])


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
def test_events_do_not_depend_on_where_the_chunks_are_cut(newline):
    raw = STREAM.replace("\n", newline).encode()
    whole = decode([raw])
    assert decode([raw[i:i + 1] for i in range(len(raw))]) == whole
    assert decode([raw[:7], raw[7:50], raw[50:51], raw[51:]]) == whole


def test_a_character_cut_between_chunks_and_a_line_separator_inside_data_survive():
    raw = 'data: {"text": "café\u2028ünïcode"}\n\n'.encode()
    cut = raw.index("é".encode()) + 1  # inside the two bytes of é
    (event,) = decode([raw[:cut], raw[cut:]])
    assert json.loads(event.data) == {"text": "café\u2028ünïcode"}


def test_a_frame_without_data_dispatches_nothing_and_the_last_id_carries_on():
    events = decode([b"\xef\xbb\xbfid: 7\n\nretry: 10\n\nretry: soon\n\nevent: x\ndata: a\n\n"])
    assert events == [ServerSentEvent(event="x", data="a", id="7", retry=10)]


def test_a_frame_cut_off_by_the_end_of_the_stream_is_not_delivered():
    decoder = SSEDecoder()
    assert decoder.feed("id: 1\ndata: whole\n\nid: 2\ndata: half") == [ServerSentEvent("message", "whole", "1")]
    assert decoder.last_event_id == "2"  # the decoder saw it; the stream state resumes from what it delivered


def _state(run_id="r1") -> EventStreamState:
    return EventStreamState(path="/runs/r1/events/stream", run_id=run_id, last_event_id=None, params=[],
                            policy=ReconnectPolicy())


def _frame(seq, kind="run_status", *, run_id=None, id=None) -> ServerSentEvent:
    data = {"seq": seq, "type": kind, "payload": {}, "created_at": "2026-01-01T00:00:00Z"}
    if run_id:
        data["run_id"] = run_id
    return ServerSentEvent(event=kind, data=json.dumps(data), id=str(seq) if id is None else id)


def test_the_stream_state_delivers_each_event_once_and_resumes_after_the_last_delivered():
    state = _state()
    delivered = [state.take(_frame(seq)) for seq in (1, 2, 2, 1, 3)]
    assert [event.seq if event else None for event in delivered] == [1, 2, None, None, 3]
    assert state.last_event_id == "3"
    assert state.request()["headers"]["Last-Event-ID"] == "3"


def test_a_session_stream_keeps_each_runs_order_apart_and_its_opaque_cursor():
    state = _state(run_id=None)
    frames = [_frame(1, run_id="a", id="c1"), _frame(1, run_id="b", id="c2"), _frame(1, run_id="a", id="c1"),
              _frame(2, run_id="b", id="c3")]
    delivered = [state.take(frame) for frame in frames]
    assert [(e.run_id, e.seq, e.id) if e else None for e in delivered] == [("a", 1, "c1"), ("b", 1, "c2"), None,
                                                                          ("b", 2, "c3")]
    assert state.last_event_id == "c3"


def test_end_stops_the_stream_and_error_raises_with_its_code():
    state = _state()
    assert state.take(ServerSentEvent("end", '{"status": "completed"}', "4")) is None
    assert state.ended and state.end_status == "completed"
    with pytest.raises(StreamError) as raised:
        _state().take(ServerSentEvent("error", '{"code": "access_revoked", "message": "You may no longer see this run."}',
                                      None))
    assert raised.value.code == "access_revoked" and "no longer" in raised.value.message
