"""A real SMTP server (aiosmtpd) and a real HTTP receiver standing in for a chat's incoming webhook,
for the tests of approval notices (tests/notifications/, the decision link's end-to-end test)."""

import json
import threading
from email import message_from_bytes, policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aiosmtpd.controller import Controller

from tests.support.processes import free_port


class Mailbox:
    """aiosmtpd's handler: every message the server accepted, parsed."""

    def __init__(self):
        self.lock = threading.Lock()
        self.messages = []

    async def handle_DATA(self, server, session, envelope):
        with self.lock:
            self.messages.append(message_from_bytes(envelope.content, policy=policy.default))
        return "250 OK"

    def received(self) -> list:
        with self.lock:
            return list(self.messages)

    def to(self, address: str) -> list:
        return [m for m in self.received() if m["To"] == address]


def smtp_server_start(mailbox: Mailbox) -> Controller:
    """An SMTP server on a free port of this machine, delivering into `mailbox`; stop() it after."""
    controller = Controller(mailbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    return controller


class ChatReceiver:
    """A chat's incoming webhook on this machine: every JSON body POSTed to it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.bodies: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with receiver.lock:
                    receiver.bodies.append(body)
                self.send_response(200)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/services/T000/B000/chat"

    def received(self) -> list[dict]:
        with self.lock:
            return list(self.bodies)
