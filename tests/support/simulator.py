"""The demo's simulated payment service on a server of its own, as in a deployment: never a
route of the main application (demo/asgi.py serves it in `make run`).

`InProcessSimulator` serves it from a thread of the test process (Django's threaded WSGI test
server with the simulator's URLconf), for tests that drive the engine in-process; the process
tests start the real ASGI application in a daphne (ProcessGroup.start_sim)."""

import threading

from django.core.handlers.wsgi import WSGIHandler
from django.core.servers.basehttp import ThreadedWSGIServer
from django.test.testcases import QuietWSGIRequestHandler

SIMULATOR_URLCONF = "demo.urls"
SIMULATOR_ASGI = "demo.asgi:application"


class _SimulatorWSGIHandler(WSGIHandler):
    def get_response(self, request):
        request.urlconf = SIMULATOR_URLCONF
        return super().get_response(request)


class InProcessSimulator:
    """`with InProcessSimulator() as sim:` — the service answers at `sim.url` (…/sim) meanwhile."""

    def __init__(self, host: str = "127.0.0.1"):
        self.host = host
        self.server: ThreadedWSGIServer | None = None
        self.thread: threading.Thread | None = None

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"{self.root_url}/sim"

    def __enter__(self) -> "InProcessSimulator":
        self.server = ThreadedWSGIServer((self.host, 0), QuietWSGIRequestHandler, allow_reuse_address=False)
        self.server.set_app(_SimulatorWSGIHandler())
        self.thread = threading.Thread(target=self.server.serve_forever, name="simulator", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
