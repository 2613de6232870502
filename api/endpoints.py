"""Model endpoints over HTTP (docs/EXTENDING.md, "Model endpoints"): list and read them (never their
credential: `credential_set` says whether one is), define one, change one — a new credential, its
removal, the models offered — through engine.actions.endpoints.endpoint_save, like the desk's: sealed,
audited, checked whole before anything is saved. Reading needs runs_app.view_modelendpoint (or
the right to define endpoints or agents), writing runs_app.change_modelendpoint; without it, 403.
None is deleted: agent versions, and so runs, point at it for good (the desk deletes none either)."""

from datetime import datetime
from typing import Annotated

from ninja import Field, Router, Schema, Status
from pydantic import ConfigDict

from access import policy as access
from agents.selectors import endpoint_agents
from api.base import COMMON_ERRORS, BodyIn, StorableText, errors
from api.errors import not_found
from config.errors import CommonRefusal, WardenError
from engine.actions.endpoints import CREDENTIAL_MAX_LENGTH, INTEGER_MAX, MODEL_FIELDS, endpoint_save
from runs_app.models import EndpointKind, ModelEndpoint
from runs_app.selectors import endpoint_get, endpoint_list

router = Router(tags=["model endpoints"])

NAME_PATTERN = "^[-a-zA-Z0-9_]+$"
# EndpointModel's prices: 12 digits, 4 after the point, not negative — a string, as it is shown: a JSON
# number (a binary float) would not say 0.15 exactly.
Price = Annotated[str, Field(pattern=r"^[0-9]{1,8}(\.[0-9]{1,4})?$",
                             description='per million tokens, in WARDEN_COST_CURRENCY: a decimal string, e.g. "0.15"')]
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Credential = Annotated[str, Field(max_length=CREDENTIAL_MAX_LENGTH, json_schema_extra={"writeOnly": True},
                                  description="write-only: sealed and stored, never shown again; printable ASCII without "
                                              "spaces (sent as a bearer token, to Anthropic as x-api-key)")]


class EndpointModelOut(Schema):
    name: str
    input_price_per_million: str = Field(description="a decimal string, in WARDEN_COST_CURRENCY")
    output_price_per_million: str = Field(description="a decimal string, in WARDEN_COST_CURRENCY")
    context_window: int = Field(description="tokens the model takes in, prompt and answer together")

    @staticmethod
    def resolve_input_price_per_million(model) -> str:
        return str(model.input_price_per_million)

    @staticmethod
    def resolve_output_price_per_million(model) -> str:
        return str(model.output_price_per_million)


class EndpointOut(Schema):
    name: str
    kind: EndpointKind
    base_url: str
    provider: str = Field(description="kind `custom` only: its provider's name in WARDEN_PROVIDERS; else empty")
    max_concurrency: int | None = Field(description="model calls one worker process has in flight to it at once; null: "
                                                    "the deployment's WARDEN_MODEL_CONCURRENCY_PER_ENDPOINT")
    timeout_seconds: float
    connect_timeout_seconds: float
    models: list[EndpointModelOut] = Field(description="the models it offers, by name")
    credential_set: bool = Field(description="whether a credential is stored (it is never shown)")
    agents: list[str] = Field(description="the agents whose current version calls it, as endpoint or fallback (slugs)")
    created_at: datetime
    updated_at: datetime

    @staticmethod
    def resolve_models(endpoint) -> list:
        return list(endpoint.offered_models.all())

    @staticmethod
    def resolve_credential_set(endpoint) -> bool:
        return bool(endpoint.credential)

    @staticmethod
    def resolve_agents(endpoint) -> list[str]:
        return getattr(endpoint, "agent_slugs", [])


class EndpointModelIn(BodyIn):
    model_config = ConfigDict(extra="forbid")

    name: StorableText = Field(min_length=1, max_length=100, description="as the endpoint names it, e.g. gpt-4o-mini")
    input_price_per_million: Price = "0"
    output_price_per_million: Price = "0"
    context_window: int = Field(ge=1, le=INTEGER_MAX)


class EndpointIn(BodyIn):
    """A new endpoint, whole."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=NAME_PATTERN, description="agent definitions name it by this")
    kind: EndpointKind = EndpointKind.CHAT_COMPLETIONS
    base_url: StorableText = Field(max_length=300, description="an http(s) URL without user or password, e.g. "
                                                               "https://api.openai.com/v1 or https://api.anthropic.com")
    provider: StorableText = Field("", max_length=64, description="kind `custom` only (and then needed)")
    credential: Credential | None = None
    max_concurrency: int | None = Field(None, ge=1, le=INTEGER_MAX)
    timeout_seconds: Seconds = 60.0
    connect_timeout_seconds: Seconds = 10.0
    models: list[EndpointModelIn] = Field(default_factory=list, max_length=200)


class EndpointPatch(BodyIn):
    """What changes; what is left out stays. `models`, when given, is the whole list offered."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, min_length=1, max_length=64, pattern=NAME_PATTERN,
                             description="a new name (agents point at the endpoint, not its name)")
    kind: EndpointKind | None = None
    base_url: StorableText | None = Field(None, max_length=300)
    provider: StorableText | None = Field(None, max_length=64)
    credential: Credential | None = Field(None, description="a new credential: it replaces the stored one (write-only)")
    credential_clear: bool = Field(False, description="remove the stored credential")
    max_concurrency: int | None = Field(None, ge=1, le=INTEGER_MAX, description="null: the deployment's default")
    timeout_seconds: Seconds | None = None
    connect_timeout_seconds: Seconds | None = None
    models: list[EndpointModelIn] | None = Field(None, max_length=200,
                                                 description="the models it offers from now on; one an agent's current "
                                                             "version names may not be left out (409 `model_in_use`)")


# The endpoint's own fields a body may set (the credential and the models go their own ways).
ENDPOINT_FIELDS = ("name", "kind", "base_url", "provider", "max_concurrency", "timeout_seconds", "connect_timeout_seconds")


def _may_see(request) -> None:
    if not access.can_see_model_endpoints(user=request.auth):
        raise WardenError(CommonRefusal.NOT_PERMITTED, "Model endpoints need the runs_app.view_modelendpoint permission.")


def _may_define(request) -> None:
    if not access.can_manage_model_endpoints(user=request.auth):
        raise WardenError(CommonRefusal.NOT_PERMITTED,
                          "Defining model endpoints needs the runs_app.change_modelendpoint permission.")


def _shown(endpoint: ModelEndpoint, using: dict[int, list[str]] | None = None) -> ModelEndpoint:
    endpoint.agent_slugs = (endpoint_agents() if using is None else using).get(endpoint.pk, [])
    return endpoint


def _existing(name: str) -> ModelEndpoint:
    endpoint = endpoint_get(name=name)
    if endpoint is None:
        raise not_found("model endpoint")
    return endpoint


def _models(payload_models) -> list[dict] | None:
    return None if payload_models is None else [model.model_dump(include=set(MODEL_FIELDS)) for model in payload_models]


@router.get("", response={200: list[EndpointOut], **COMMON_ERRORS, **errors(403)}, summary="List model endpoints")
def model_endpoints_list(request):
    """Every endpoint, by name, with the models it offers and the agents calling it."""
    _may_see(request)
    using = endpoint_agents()
    return [_shown(endpoint, using) for endpoint in endpoint_list()]


@router.get("/{name}", response={200: EndpointOut, **COMMON_ERRORS, **errors(403)}, summary="Model endpoint detail")
def model_endpoints_get(request, name: str):
    _may_see(request)
    return _shown(_existing(name))


@router.post("", response={201: EndpointOut, **COMMON_ERRORS, **errors(403, 409)}, summary="Define a model endpoint")
def model_endpoints_create(request, payload: EndpointIn):
    """Needs runs_app.change_modelendpoint. A field refused (a URL that is no http(s) URL or carries a
    password, kind `custom` without a provider or a provider on another kind, a credential that cannot
    be sent as a bearer token, a model listed twice) is answered 422 `invalid_endpoint` naming each,
    and nothing is saved; a name taken, 409 `endpoint_name_taken`."""
    _may_define(request)
    endpoint = ModelEndpoint(**payload.model_dump(include=set(ENDPOINT_FIELDS)))
    endpoint_save(endpoint=endpoint, acting_user=request.auth, changed=sorted(payload.model_fields_set),
                  credential=payload.credential, models=_models(payload.models))
    return Status(201, _shown(_existing(endpoint.name)))


@router.patch("/{name}", response={200: EndpointOut, **COMMON_ERRORS, **errors(403, 409)}, summary="Change a model endpoint")
def model_endpoints_update(request, name: str, payload: EndpointPatch):
    """Rotate the credential (`credential`), remove it (`credential_clear`), replace the models offered
    (`models`) or change any other field; the next model call of every worker uses what this saves,
    without a restart. Refused as a create is; a model an agent's current version names may not be
    dropped (409 `model_in_use`, naming the agents). Nothing is saved on a refusal."""
    _may_define(request)
    endpoint = _existing(name)
    given = payload.model_fields_set
    if not given:
        return _shown(endpoint)  # nothing asked, nothing saved: no audit entry of a change that is none
    for field in ENDPOINT_FIELDS:
        value = getattr(payload, field)
        # A field left out, or null where null means nothing (all but max_concurrency), stays.
        if field in given and (value is not None or field == "max_concurrency"):
            setattr(endpoint, field, value)
    endpoint_save(endpoint=endpoint, acting_user=request.auth, changed=sorted(given), credential=payload.credential,
                  credential_clear=payload.credential_clear, models=_models(payload.models))
    return _shown(_existing(endpoint.name))
