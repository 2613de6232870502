"""API keys a person creates or revokes on someone's behalf (the desk): the key and its audit entry
in one transaction — a key acts as its owner, so who handed it out is on record."""

from django.db import transaction

from approvals_app.services import audit_record
from sessions_app.api_keys import api_key_create, api_key_revoke
from sessions_app.models import ApiKey


def api_key_issue(*, owner, name: str, acting_user) -> tuple[ApiKey, str]:
    """A new key for `owner`, made by `acting_user`; the secret is returned once, never stored."""
    with transaction.atomic():
        api_key, token = api_key_create(owner=owner, name=name)
        audit_record(actor=acting_user, action="create", obj=api_key, before={},
                     after={"owner": owner.pk, "name": api_key.name, "prefix": api_key.prefix},
                     note=f"API key {api_key.name} of {owner.pk}")
    return api_key, token


def api_key_withdraw(*, api_key: ApiKey, acting_user) -> bool:
    """Revoke `api_key` for good, by `acting_user`; False (and nothing audited) if it already was."""
    with transaction.atomic():
        if not api_key_revoke(api_key=api_key):
            return False
        audit_record(actor=acting_user, action="revoke", obj=api_key, before={"revoked": False}, after={"revoked": True},
                     note=f"API key {api_key.name} of {api_key.owner_id}")
    return True
