"""Model providers, looked up by name (Run.provider) in settings.WARDEN_PROVIDERS, which maps
each name to the dotted path of a class implementing runs_app.providers.base.Provider — so a
deployment adds a model vendor without touching Warden. A provider's module is imported the
first time a run asks for it (the OpenAI SDK alone costs a worker ~0.3 s to import)."""

from functools import cache

from django.conf import settings
from django.utils.module_loading import import_string

from runs_app.providers.base import Provider


class UnknownProvider(ValueError):
    pass


@cache
def _provider_class(name: str) -> type:
    path = settings.WARDEN_PROVIDERS.get(name)
    if path is None:
        raise UnknownProvider(f"unknown model provider {name!r}; configured: {', '.join(sorted(settings.WARDEN_PROVIDERS))}")
    return import_string(path)


def get_provider(name: str, *, endpoint=None) -> Provider:
    """The provider `name`, for a call to `endpoint` (runs_app.endpoints.Endpoint: a run's agent
    names a model endpoint) or to the deployment's default one. A provider class that serves
    endpoints takes them as `endpoint=` (runs_app.providers.openai.OpenAIProvider)."""
    return _provider_class(name)(endpoint=endpoint) if endpoint is not None else _provider_class(name)()
