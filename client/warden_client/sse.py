"""Server-Sent Events, parsed as the WHATWG HTML standard says ("Interpreting an event stream"),
incrementally: feed it bytes as they arrive, get the events whose blank line has arrived.

Only CR, LF and CRLF end a line (a U+2028 inside a JSON string is data, not a line break, unlike
`str.splitlines`); `data:` lines join with "\\n"; a comment (`:` first) is skipped; one space after
the colon is dropped; `id:` sets the last event id, which later events without one keep; `retry:`
with digits only sets the reconnection delay; a frame without data (`retry: 2000`) dispatches
nothing; a frame cut off by the end of the stream is discarded — the caller resumes from the last
whole event's id."""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class ServerSentEvent:
    event: str
    data: str
    id: str | None
    retry: int | None = None


class SSEDecoder:
    def __init__(self) -> None:
        self._bytes = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""
        self._skip_lf = False  # the last chunk ended with CR: a LF opening the next one ends nothing
        self._at_start = True
        self._event = ""
        self._data: list[str] = []
        self._has_data = False
        self.last_event_id: str | None = None
        self.retry: int | None = None
        self.comments = 0

    def feed_bytes(self, chunk: bytes) -> list[ServerSentEvent]:
        return self.feed(self._bytes.decode(chunk))

    def feed(self, text: str) -> list[ServerSentEvent]:
        if self._at_start and text:
            self._at_start = False
            text = text.removeprefix("\ufeff")
        if self._skip_lf and text:
            self._skip_lf = False
            text = text.removeprefix("\n")
        self._text += text
        events: list[ServerSentEvent] = []
        position = 0
        for match in _LINE_END.finditer(self._text):
            if match.group() == "\r" and match.end() == len(self._text):
                self._skip_lf = True  # CRLF split across two chunks
            event = self._line(self._text[position:match.start()])
            if event is not None:
                events.append(event)
            position = match.end()
        self._text = self._text[position:]
        return events

    def _line(self, line: str) -> ServerSentEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            self.comments += 1
            return None
        name, colon, value = line.partition(":")
        if colon:
            value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
            self._has_data = True
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self.retry = int(value)
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        event, data, has_data = self._event, self._data, self._has_data
        self._event, self._data, self._has_data = "", [], False
        if not has_data:
            return None
        return ServerSentEvent(event=event or "message", data="\n".join(data), id=self.last_event_id, retry=self.retry)
