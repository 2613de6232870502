"""The URLs of a web server the suite shares between tests (tests/support/processes.py:
SharedServers): the server's own, plus one that forgets what the server's process cached about
the previous test's database — which the suite flushes between tests, so the content types are
created again with new ids. Only the servers the suite starts have it (tests/settings.py), and only
with the token they were started with."""

import hmac
import os

from django.contrib.contenttypes.models import ContentType
from django.core.cache import caches
from django.http import HttpResponse, HttpResponseNotFound
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from server.urls import urlpatterns as server_urlpatterns

TOKEN_HEADER = "X-Test-Reset-Token"


@csrf_exempt
def reset(request):
    token = os.environ.get("WARDEN_TEST_SHARED_SERVER", "")
    if not token or not hmac.compare_digest(request.headers.get(TOKEN_HEADER, ""), token):
        return HttpResponseNotFound()
    ContentType.objects.clear_cache()
    caches["local"].clear()
    return HttpResponse(status=204)


urlpatterns = [path("__tests__/reset", reset), *server_urlpatterns]
