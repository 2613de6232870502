import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()  # set up Django before importing consumers

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from config.security import StaticFilesHandler, TrustedOriginValidator  # noqa: E402
from sessions_app.console.routing import websocket_urlpatterns  # noqa: E402

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
