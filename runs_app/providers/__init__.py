"""Model providers, looked up by name (Run.provider)."""

from runs_app.providers.base import Provider


def get_provider(name: str) -> Provider:
    if name == "scripted":
        from runs_app.providers.scripted import ScriptedProvider

        return ScriptedProvider()
    if name == "openai":
        from runs_app.providers.openai import OpenAIProvider

        return OpenAIProvider()
    raise ValueError(f"unknown model provider {name!r}")
