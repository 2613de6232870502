"""A tiny server answering every POST with one canned text/event-stream body: for the stream events
LLMock cannot send (an Anthropic `error` event mid-stream, a Responses `response.failed` or
`response.incomplete` event), written as the real APIs write them.

    with CannedSSE([("message_start", {...}), ("error", {...})]) as server:
        AnthropicProvider(endpoint=...server.base_url...)
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class CannedSSE:
    def __init__(self, events: list[tuple[str, dict]]):
        body = b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)
        self.requests: list[dict] = []  # each request's body
        self.headers: list[dict] = []  # and its headers
        requests, headers = self.requests, self.headers

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                requests.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}"))
                headers.append(dict(self.headers))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "CannedSSE":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
