"""Model endpoints as a provider calls them (docs/EXTENDING.md, "Model endpoints").

An agent version may name a `ModelEndpoint` and one of its models; its runs carry the endpoint's id
in their provider options (`ENDPOINT_OPTION`, set by engine.state.run_create from the version, never
from a request). A worker reads the row on every model call, before it gives its database
connection back (`run_endpoint`): a rotated credential or a changed URL, limit or timeout applies
to the next call, with no cache to invalidate and no restart. Opening the sealed credential is
memoized by its ciphertext (config.secrets), so the per-call cost is one indexed read.

A run whose agent names no endpoint calls the deployment's default, made of the OPENAI_* settings
(`endpoint_default`) — what Warden did before endpoints were data."""

import functools
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.db import connection

from config.secrets import SecretUnreadable, secret_open
from runs_app.models import EndpointKind, EndpointModel, ModelEndpoint
from runs_app.providers.base import PermanentModelError

# The provider (a name in WARDEN_PROVIDERS) that speaks each kind of endpoint; kind `custom` names its
# own (`ModelEndpoint.provider`, `endpoint_provider`).
ENDPOINT_PROVIDERS = {
    EndpointKind.CHAT_COMPLETIONS: "openai",
    EndpointKind.RESPONSES: "openai-responses",
    EndpointKind.ANTHROPIC_MESSAGES: "anthropic",
}
# The key of a run's provider options that names its endpoint (by id: a rename does not move runs).
ENDPOINT_OPTION = "endpoint"
# The keys naming the agent's fallback endpoint (by id) and its model (engine/model_route.py says when
# a call goes there); set by engine.state.run_create from the version, never from a request.
FALLBACK_ENDPOINT_OPTION = "fallback_endpoint"
FALLBACK_MODEL_OPTION = "fallback_model"


@dataclass(frozen=True)
class Endpoint:
    """What a provider needs for one call. `slots` names the endpoint's per-process call slots
    (runs_app.providers.interrupt.endpoint_slot); `model` is the run's model, else the default one;
    `provider` the name in WARDEN_PROVIDERS that speaks it (`endpoint_provider`).
    The credential is left out of repr(): a traceback or a log of the object never shows it."""

    slots: str
    name: str
    kind: str
    base_url: str
    credential: str = field(repr=False)
    model: str
    max_concurrency: int
    timeout_seconds: float
    connect_timeout_seconds: float
    provider: str = "openai"


def endpoint_provider(*, kind: str, provider: str = "") -> str:
    """The provider that speaks an endpoint of `kind`: the one of its kind, or for kind `custom`
    the one it names itself ("" when it names none)."""
    return provider if kind == EndpointKind.CUSTOM else ENDPOINT_PROVIDERS.get(kind, "")


def endpoint_default() -> Endpoint:
    """The deployment's default endpoint, from the environment (OPENAI_BASE_URL, OPENAI_API_KEY,
    OPENAI_MODEL, OPENAI_TIMEOUT_SECONDS): read at every call, as the settings stand."""
    timeout = float(settings.OPENAI_TIMEOUT_SECONDS)
    return Endpoint(
        slots=settings.OPENAI_BASE_URL, name="default", kind=EndpointKind.CHAT_COMPLETIONS,
        base_url=settings.OPENAI_BASE_URL, credential=settings.OPENAI_API_KEY, model=settings.OPENAI_MODEL,
        max_concurrency=settings.WARDEN_MODEL_CONCURRENCY_PER_ENDPOINT,
        timeout_seconds=timeout, connect_timeout_seconds=timeout,
    )


_FIELDS = ("id", "name", "kind", "base_url", "credential", "max_concurrency", "timeout_seconds", "connect_timeout_seconds",
           "provider")


@functools.cache
def _endpoint_sql() -> str:
    # A fixed statement, not the ORM: a worker sends it before every model call of such a run.
    columns = ", ".join(f'"{ModelEndpoint._meta.get_field(name).column}"' for name in _FIELDS)
    return f'SELECT {columns} FROM "{ModelEndpoint._meta.db_table}" WHERE "id" = %s'


def endpoint_read(endpoint_id: int, *, model: str = "") -> Endpoint:
    """The endpoint as it stands now (ModelEndpoint.DoesNotExist when it is gone)."""
    with connection.cursor() as cursor:
        cursor.execute(_endpoint_sql(), [int(endpoint_id)])
        row = cursor.fetchone()
    if row is None:
        raise ModelEndpoint.DoesNotExist(f"model endpoint {endpoint_id}")
    values = dict(zip(_FIELDS, row))
    return Endpoint(
        slots=f"endpoint:{values['id']}", name=values["name"], kind=values["kind"], base_url=values["base_url"],
        credential=secret_open(values["credential"]) if values["credential"] else "",
        model=model,
        max_concurrency=values["max_concurrency"] or settings.WARDEN_MODEL_CONCURRENCY_PER_ENDPOINT,
        timeout_seconds=values["timeout_seconds"], connect_timeout_seconds=values["connect_timeout_seconds"],
        provider=endpoint_provider(kind=values["kind"], provider=values["provider"]),
    )


def run_endpoint(run) -> Endpoint | None:
    """The endpoint the run's next model call goes to, read now; None: the default endpoint.
    PermanentModelError when it cannot be called at all (gone, or its credential unreadable)."""
    options = run.provider_options or {}
    endpoint_id = options.get(ENDPOINT_OPTION)
    if endpoint_id is None:
        return None
    try:
        return endpoint_read(endpoint_id, model=str(options.get("model") or ""))
    except ModelEndpoint.DoesNotExist as error:
        raise PermanentModelError(f"the run's model endpoint ({endpoint_id}) no longer exists") from error
    except SecretUnreadable as error:
        raise PermanentModelError(f"the credential of model endpoint {endpoint_id} cannot be read ({error}): "
                                  "enter it again in the desk") from error


def endpoint_get(*, name: str) -> ModelEndpoint | None:
    return ModelEndpoint.objects.filter(name=name).first() if isinstance(name, str) and name else None


def endpoint_names() -> list[str]:
    return list(ModelEndpoint.objects.order_by("name").values_list("name", flat=True))


def endpoint_model_names(endpoint: ModelEndpoint) -> list[str]:
    return list(EndpointModel.objects.filter(endpoint=endpoint).order_by("name").values_list("name", flat=True))


# --- the fallback, and the terms of a model (docs/EXTENDING.md, "Model endpoints") -----------------

def run_fallback_endpoint(run) -> Endpoint | None:
    """The endpoint the run's model calls fall back to, read now (with its model); None: the agent
    names none. PermanentModelError when it cannot be called at all (gone, or its credential
    unreadable)."""
    options = run.provider_options or {}
    endpoint_id = options.get(FALLBACK_ENDPOINT_OPTION)
    if endpoint_id is None:
        return None
    try:
        return endpoint_read(endpoint_id, model=str(options.get(FALLBACK_MODEL_OPTION) or ""))
    except ModelEndpoint.DoesNotExist as error:
        raise PermanentModelError(f"the run's fallback model endpoint ({endpoint_id}) no longer exists") from error
    except SecretUnreadable as error:
        raise PermanentModelError(f"the credential of model endpoint {endpoint_id} cannot be read ({error}): "
                                  "enter it again in the desk") from error


def endpoint_provider_name(endpoint: Endpoint) -> str:
    """The provider (a name in WARDEN_PROVIDERS) that speaks to `endpoint`: its kind's, or — kind
    `custom` — the one the endpoint names."""
    return endpoint_provider(kind=endpoint.kind, provider=endpoint.provider)


@dataclass(frozen=True)
class ModelTerms:
    """What one model of an endpoint costs (per million tokens, WARDEN_COST_CURRENCY) and takes in."""

    input_price_per_million: Decimal
    output_price_per_million: Decimal
    context_window: int

    def cost(self, *, input_tokens: int, output_tokens: int) -> Decimal:
        """What a call that used these tokens cost, to the micro-unit Step.cost keeps."""
        return ((input_tokens * self.input_price_per_million + output_tokens * self.output_price_per_million)
                / Decimal(1_000_000)).quantize(Decimal("0.000001"))


_TERMS_SQL = ('SELECT "endpoint_id", "name", "input_price_per_million", "output_price_per_million", "context_window" '
              f'FROM "{EndpointModel._meta.db_table}" WHERE ("endpoint_id", "name") IN ({{pairs}})')


def run_model_terms(run) -> dict[str, ModelTerms]:
    """The terms of the run's model and of its fallback model, as the endpoints offer them now, keyed
    "primary" and "fallback" (a key is missing when the run names no such model, or its endpoint no
    longer offers it). One fixed statement, before each model call of a run with an endpoint."""
    options = run.provider_options or {}
    wanted = {role: (options.get(endpoint_key), str(options.get(model_key) or ""))
              for role, endpoint_key, model_key in (("primary", ENDPOINT_OPTION, "model"),
                                                    ("fallback", FALLBACK_ENDPOINT_OPTION, FALLBACK_MODEL_OPTION))
              if options.get(endpoint_key) is not None}
    if not wanted:
        return {}
    pairs = ", ".join(["(%s, %s)"] * len(wanted))
    with connection.cursor() as cursor:
        cursor.execute(_TERMS_SQL.format(pairs=pairs), [v for endpoint_id, model in wanted.values() for v in (int(endpoint_id), model)])
        rows = {(endpoint_id, name): ModelTerms(Decimal(inp), Decimal(out), window)
                for endpoint_id, name, inp, out, window in cursor.fetchall()}
    return {role: rows[(int(endpoint_id), model)] for role, (endpoint_id, model) in wanted.items()
            if (int(endpoint_id), model) in rows}
