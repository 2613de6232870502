"""The one NinjaAPI of Warden (routers are added per app)."""

from ninja import NinjaAPI

api = NinjaAPI(title="Warden API", version="1", urls_namespace="api-v1")
