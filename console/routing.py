import os

from django.urls import path

from console.consumer import ConsoleConsumer, EchoConsumer
from console.views import CONSOLE_WS_PATH

websocket_urlpatterns: list = [path(CONSOLE_WS_PATH, ConsoleConsumer.as_asgi())]

# WARDEN_BENCH_ECHO: set to 1 only by bench/ws_latency.py, to measure a raw websocket round trip
# through the same daphne as the console; off by default, so production has no echo endpoint.
if os.environ.get("WARDEN_BENCH_ECHO") == "1":
    websocket_urlpatterns.append(path("ws/bench/echo/", EchoConsumer.as_asgi()))
