"""Defining model endpoints (docs/EXTENDING.md, "Model endpoints"): a save of an endpoint's row and,
when one is given, its credential — sealed (config.secrets) before it is stored, never returned —
with an audit entry naming who and what changed (for the credential: that it was set, rotated or
removed, never its value), in one transaction. Workers read the row on every call, so the next
model call uses what this commits."""

from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction

from access import policy as access
from approvals_app.services import audit_record
from config.errors import CommonRefusal, WardenError
from config.secrets import secret_seal
from runs_app.models import EndpointKind, ModelEndpoint

CREDENTIAL_MAX_LENGTH = 4000


class EndpointCredentialInvalid(WardenError):
    def __init__(self, message: str):
        super().__init__(CommonRefusal.BAD_REQUEST, message,
                         fields=[{"field": "credential", "message": message, "type": CommonRefusal.BAD_REQUEST.value}])


def endpoint_credential_problem(credential: str) -> str:
    """Why `credential` cannot be sent in an Authorization header, or ''."""
    if len(credential) > CREDENTIAL_MAX_LENGTH:
        return f"at most {CREDENTIAL_MAX_LENGTH} characters"
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in credential):
        return "printable ASCII without spaces (it is sent as a bearer token)"
    return ""


def endpoint_base_url_problem(base_url: str) -> str:
    """Why `base_url` cannot be an endpoint's, or ''."""
    parts = urlsplit(base_url or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an http(s) URL"
    if parts.username or parts.password:
        return "no user or password in the URL: put the secret in the credential"
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


def endpoint_save(*, endpoint: ModelEndpoint, acting_user, changed: list[str] | tuple = (),
                  credential: str | None = None, credential_clear: bool = False) -> ModelEndpoint:
    """Create or change `endpoint` (its fields as the caller set them); `credential` replaces the
    stored one (None: keep it), `credential_clear` removes it. Needs runs_app.change_modelendpoint."""
    if not access.can_manage_model_endpoints(user=acting_user):
        raise WardenError(CommonRefusal.NOT_PERMITTED, "Defining model endpoints needs the runs_app.change_modelendpoint permission.")
    if problem := endpoint_base_url_problem(endpoint.base_url):
        raise WardenError(CommonRefusal.BAD_REQUEST, f"The base URL was refused, nothing was saved: {problem}.",
                          fields=[{"field": "base_url", "message": problem, "type": CommonRefusal.BAD_REQUEST.value}])
    if problem := endpoint_provider_problem(kind=endpoint.kind, provider=endpoint.provider):
        raise WardenError(CommonRefusal.BAD_REQUEST, f"The provider was refused, nothing was saved: {problem}.",
                          fields=[{"field": "provider", "message": problem, "type": CommonRefusal.BAD_REQUEST.value}])
    if credential is not None:
        credential = credential.strip()
        problem = endpoint_credential_problem(credential)
        if problem:
            raise EndpointCredentialInvalid(f"The credential was refused, nothing was saved: {problem}.")
    adding = endpoint.pk is None
    had_credential = bool(ModelEndpoint.objects.filter(pk=endpoint.pk).exclude(credential="").exists()) if not adding else False
    credential_change = ""
    if credential:
        endpoint.credential = secret_seal(credential)
        credential_change = "rotated" if had_credential else "set"
    elif credential_clear:
        endpoint.credential = ""
        credential_change = "removed" if had_credential else ""
    with transaction.atomic():
        endpoint.save()
        audit_record(actor=acting_user, action="define_model_endpoint", obj=endpoint, before={},
                     after={"name": endpoint.name, "kind": endpoint.kind, "base_url": endpoint.base_url,
                            **({"provider": endpoint.provider} if endpoint.provider else {}),
                            "changed": sorted(set(changed) - {"new_credential", "credential_clear"}),
                            **({"credential": credential_change} if credential_change else {})},
                     note="created" if adding else "")
    return endpoint
