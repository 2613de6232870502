"""Defining model endpoints (docs/EXTENDING.md, "Model endpoints"): a save of an endpoint's row, when
one is given its credential — sealed (config.secrets) before it is stored, never returned — and when
given the models it offers, with an audit entry naming who and what changed (for the credential:
that it was set, rotated or removed, never its value), in one transaction. Everything is checked
first: a refusal names each wrong field and nothing is saved. Workers read the row on every call, so
the next model call uses what this commits."""

import math
from decimal import Decimal, InvalidOperation
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, transaction

from access import policy as access
from agents.selectors import endpoint_models_in_use
from approvals_app.services import audit_record
from config.errors import CommonRefusal, WardenError
from config.secrets import secret_seal
from runs_app.errors import EndpointRefusal
from runs_app.models import EndpointKind, EndpointModel, ModelEndpoint
from runs_app.selectors import ENDPOINT_NAME

CREDENTIAL_MAX_LENGTH = 4000
MODEL_NAME_MAX_LENGTH = 100
# EndpointModel's prices: DecimalField(max_digits=12, decimal_places=4).
PRICE_MAX = Decimal("99999999.9999")
PRICE_PLACES = 4
# PositiveIntegerField's range (context_window, max_concurrency).
INTEGER_MAX = 2**31 - 1
# An offered model as endpoint_save takes it (and the audit entry and the API show it).
MODEL_FIELDS = ("name", "input_price_per_million", "output_price_per_million", "context_window")


class EndpointInvalid(WardenError):
    """`errors` maps each offending field (`base_url`, `models.1.name`, …) to what is wrong with it
    (never echoing a credential); nothing was saved."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__(
            EndpointRefusal.INVALID_ENDPOINT,
            "The model endpoint was refused, nothing was saved: "
            + "; ".join(f"{field}: {message}" for field, message in errors.items()),
            fields=[{"field": f"body.{field}", "message": message, "type": EndpointRefusal.INVALID_ENDPOINT.value}
                    for field, message in errors.items()],
        )


def endpoint_credential_problem(credential: str) -> str:
    """Why `credential` cannot be sent in an Authorization header, or ''."""
    if len(credential) > CREDENTIAL_MAX_LENGTH:
        return f"at most {CREDENTIAL_MAX_LENGTH} characters"
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in credential):
        return "printable ASCII without spaces (it is sent as a bearer token)"
    return ""


def endpoint_base_url_problem(base_url: str) -> str:
    """Why `base_url` cannot be an endpoint's, or ''."""
    try:
        parts = urlsplit(base_url or "")
        hostname = parts.hostname
    except ValueError:  # an unbalanced [ or a port that is no number
        return "an http(s) URL"
    if parts.scheme not in ("http", "https") or not hostname:
        return "an http(s) URL"
    if parts.username or parts.password:
        return "no user or password in the URL: put the secret in the credential"
    if len(base_url) > ModelEndpoint._meta.get_field("base_url").max_length:
        return f"at most {ModelEndpoint._meta.get_field('base_url').max_length} characters"
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in base_url):
        return "no spaces or control characters"
    return ""


def endpoint_provider_problem(*, kind: str, provider: str) -> str:
    """Why an endpoint of `kind` cannot name `provider`, or '': kind `custom` names one of the
    deployment's WARDEN_PROVIDERS, every other kind has its own (runs_app.endpoints.ENDPOINT_PROVIDERS)."""
    if kind != EndpointKind.CUSTOM:
        return "only an endpoint of kind “a deployment's own provider” names its provider: leave it blank" if provider else ""
    if not provider:
        return "kind “a deployment's own provider” needs the name of that provider (a key of WARDEN_PROVIDERS)"
    if provider not in settings.WARDEN_PROVIDERS:
        return (f"no provider {provider!r} is configured; WARDEN_PROVIDERS has: "
                f"{', '.join(sorted(settings.WARDEN_PROVIDERS))}")
    return ""


def endpoint_problems(endpoint: ModelEndpoint) -> dict[str, str]:
    """What is wrong with the endpoint's fields as the caller set them ({} when nothing is)."""
    problems = {}
    if not ENDPOINT_NAME.fullmatch(endpoint.name or ""):
        problems["name"] = "1 to 64 letters, digits, hyphens or underscores"
    if endpoint.kind not in EndpointKind.values:
        problems["kind"] = f"one of {', '.join(EndpointKind.values)}"
    elif problem := endpoint_provider_problem(kind=endpoint.kind, provider=endpoint.provider or ""):
        problems["provider"] = problem
    if problem := endpoint_base_url_problem(endpoint.base_url):
        problems["base_url"] = problem
    if endpoint.max_concurrency is not None and not 1 <= endpoint.max_concurrency <= INTEGER_MAX:
        problems["max_concurrency"] = "at least 1 (or null: the deployment's WARDEN_MODEL_CONCURRENCY_PER_ENDPOINT)"
    for field in ("timeout_seconds", "connect_timeout_seconds"):
        value = getattr(endpoint, field)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            problems[field] = "a number of seconds, more than 0"
    return problems


def endpoint_models_problems(models: list[dict]) -> dict[str, str]:
    """What is wrong with the offered models as given ({} when nothing is)."""
    problems = {}
    seen = set()
    for index, model in enumerate(models):
        name = model.get("name") or ""
        if not name.strip() or len(name) > MODEL_NAME_MAX_LENGTH:
            problems[f"models.{index}.name"] = f"1 to {MODEL_NAME_MAX_LENGTH} characters"
        elif name in seen:
            problems[f"models.{index}.name"] = f"{name!r} is listed twice"
        seen.add(name)
        for field in ("input_price_per_million", "output_price_per_million"):
            if problem := _price_problem(model.get(field, 0)):
                problems[f"models.{index}.{field}"] = problem
        window = model.get("context_window")
        if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= INTEGER_MAX:
            problems[f"models.{index}.context_window"] = "a whole number of tokens, at least 1"
    return problems


def _price_problem(price) -> str:
    try:
        price = Decimal(str(price))
    except InvalidOperation:
        return "a decimal number"
    if not price.is_finite() or price < 0 or price > PRICE_MAX:
        return f"from 0 to {PRICE_MAX}"
    if -price.as_tuple().exponent > PRICE_PLACES:
        return f"at most {PRICE_PLACES} decimal places"
    return ""


def endpoint_save(*, endpoint: ModelEndpoint, acting_user, changed: list[str] | tuple = (),
                  credential: str | None = None, credential_clear: bool = False,
                  models: list[dict] | None = None) -> ModelEndpoint:
    """Create or change `endpoint` (its fields as the caller set them); `credential` replaces the
    stored one (None: keep it), `credential_clear` removes it; `models` (dicts of MODEL_FIELDS)
    replace the models it offers, matched by name (None: keep them). Needs
    runs_app.change_modelendpoint. EndpointInvalid names every wrong field; a model an agent's current
    version names may not be dropped (EndpointRefusal.MODEL_IN_USE); nothing is saved on a refusal."""
    if not access.can_manage_model_endpoints(user=acting_user):
        raise WardenError(CommonRefusal.NOT_PERMITTED, "Defining model endpoints needs the runs_app.change_modelendpoint permission.")
    problems = endpoint_problems(endpoint)
    if credential is not None:
        credential = credential.strip()
        if problem := endpoint_credential_problem(credential):
            problems["credential"] = problem  # says what is wrong, never echoes it
        elif credential and credential_clear:
            problems["credential_clear"] = "either a new credential or its removal, not both"
    if models is not None:
        problems |= endpoint_models_problems(models)
    if problems:
        raise EndpointInvalid(problems)
    adding = endpoint.pk is None
    with transaction.atomic():
        if not adding:
            # The lock agent_save takes on an endpoint it names: an agent cannot pick a model while
            # this drops it.
            ModelEndpoint.objects.select_for_update(no_key=True).filter(pk=endpoint.pk).first()
        had_credential = not adding and ModelEndpoint.objects.filter(pk=endpoint.pk).exclude(credential="").exists()
        credential_change = ""
        if credential:
            endpoint.credential = secret_seal(credential)
            credential_change = "rotated" if had_credential else "set"
        elif credential_clear:
            endpoint.credential = ""
            credential_change = "removed" if had_credential else ""
        if ModelEndpoint.objects.filter(name=endpoint.name).exclude(pk=endpoint.pk).exists():
            raise WardenError(EndpointRefusal.ENDPOINT_NAME_TAKEN, f"A model endpoint {endpoint.name!r} exists already.",
                              fields=[{"field": "body.name", "message": "taken",
                                       "type": EndpointRefusal.ENDPOINT_NAME_TAKEN.value}])
        try:
            with transaction.atomic():
                endpoint.save()
        except IntegrityError as error:  # the same name saved at the same moment
            raise WardenError(EndpointRefusal.ENDPOINT_NAME_TAKEN,
                              f"A model endpoint {endpoint.name!r} exists already.") from error
        offered = _offered_models_replace(endpoint, models, adding=adding) if models is not None else {}
        audit_record(actor=acting_user, action="define_model_endpoint", obj=endpoint, before={},
                     after={"name": endpoint.name, "kind": endpoint.kind, "base_url": endpoint.base_url,
                            **({"provider": endpoint.provider} if endpoint.provider else {}),
                            "changed": sorted(set(changed) - {"new_credential", "credential_clear", "credential"}),
                            **({"credential": credential_change} if credential_change else {}),
                            **({"models": offered} if offered else {})},
                     note="created" if adding else "")
    return endpoint


def endpoint_models_set(*, endpoint: ModelEndpoint, models: list[dict], acting_user) -> ModelEndpoint:
    """Replace the models `endpoint` offers (endpoint_save with nothing else changed)."""
    return endpoint_save(endpoint=endpoint, acting_user=acting_user, changed=["models"], models=models)


def _offered_models_replace(endpoint: ModelEndpoint, models: list[dict], *, adding: bool) -> dict[str, list[str]]:
    """Make the endpoint offer exactly `models`, in the caller's transaction (under its lock on the
    endpoint); what was added, removed or repriced, by name, for the audit entry."""
    wanted = {model["name"]: model for model in models}
    existing = {} if adding else {row.name: row for row in EndpointModel.objects.filter(endpoint=endpoint)}
    removed = sorted(set(existing) - set(wanted))
    used = endpoint_models_in_use(endpoint_id=endpoint.pk) if removed else {}
    if still_used := [name for name in removed if name in used]:
        raise WardenError(
            EndpointRefusal.MODEL_IN_USE,
            "; ".join(f"{name} is the model of {', '.join(used[name])}: point "
                      f"{'them' if len(used[name]) > 1 else 'it'} at another model first" for name in still_used)
            + ". Nothing was saved.",
            fields=[{"field": "body.models", "message": f"{name} is still used by {', '.join(used[name])}",
                     "type": EndpointRefusal.MODEL_IN_USE.value} for name in still_used])
    EndpointModel.objects.filter(endpoint=endpoint, name__in=removed).delete()
    added, repriced = [], []
    for name, model in wanted.items():
        values = {field: model.get(field, 0) for field in MODEL_FIELDS[1:]}
        values = {**values, **{field: Decimal(str(values[field])) for field in MODEL_FIELDS[1:3]}}
        row = existing.get(name)
        if row is None:
            EndpointModel.objects.create(endpoint=endpoint, name=name, **values)
            added.append(name)
        elif any(getattr(row, field) != value for field, value in values.items()):
            for field, value in values.items():
                setattr(row, field, value)
            row.save(update_fields=list(values))
            repriced.append(name)
    return {key: names for key, names in (("added", sorted(added)), ("removed", removed), ("changed", sorted(repriced)))
            if names}
