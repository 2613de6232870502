"""The simulated payment service's own ASGI application (demo mode only). `manage.py serve_all`
serves it from a daphne of its own, on the web port + 1:

    daphne -p 8001 demo.asgi:application

Every request resolves against the simulator's URLconf (demo/urls.py), never the main
application's: the main application has no /sim route in any mode. It speaks HTTP only."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
get_asgi_application()  # set up Django before anything reads settings

from django.conf import settings  # noqa: E402
from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402

SIMULATOR_URLCONF = "demo.urls"

if not settings.WARDEN_DEMO:
    raise ImproperlyConfigured("The simulated payment service exists only in demo mode: set WARDEN_DEMO=1.")


class SimulatorHandler(ASGIHandler):
    def create_request(self, scope, body_file):
        request, error_response = super().create_request(scope, body_file)
        if request is not None:
            request.urlconf = SIMULATOR_URLCONF  # resolved per request, whatever ROOT_URLCONF says
        return request, error_response


application = SimulatorHandler()
