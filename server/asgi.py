import os

from django.conf import settings
from django.core.asgi import get_asgi_application

from config.errors import StartupRefused

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
if not settings.configured:
    # Loaded first by a web server (daphne): its database connections come from a pool
    # (WARDEN_DB_POOL_SIZE in config/settings.py). Not so when a test imports this module later.
    os.environ["WARDEN_WEB_SERVER"] = "1"
try:
    django_asgi_app = get_asgi_application()  # set up Django before importing consumers
except StartupRefused as refused:
    raise SystemExit(f"warden: {refused}") from None

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from operations.liveness import heartbeat_thread_start  # noqa: E402
from operations.models import ProcessRole  # noqa: E402
from config.security import StaticFilesHandler, TrustedOriginValidator  # noqa: E402
from console.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # Static files (admin and console CSS/JS) are served by the app itself, so `make run`
        # needs no separate web server; a production deployment may put a CDN in front.
        "http": StaticFilesHandler(django_asgi_app),
        # The Origin must be exactly one of CSRF_TRUSTED_ORIGINS (config/security.py); then the
        # Django session identifies the user, and consumers check ownership themselves.
        "websocket": TrustedOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# This web process's heartbeat row (connected live clients, for /metrics; docs/OPERATIONS.md).
heartbeat_thread_start(role=ProcessRole.WEB)
