"""API keys of the HTTP API: create (the secret is shown once), revoke, and authenticate.

A key reads `wdn_<prefix>_<secret>`. The prefix is public and finds the row; the whole
string is hashed with SHA-256 and compared in constant time. A slow password hash is not
needed: the secret is 256 random bits, not something a person chose.
"""

import hashlib
import hmac
import secrets
from datetime import timedelta
from functools import cache

from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from sessions_app.models import ApiKey

KEY_SCHEME = "wdn"
PREFIX_LENGTH = 12
# last_used_at is refreshed at most this often, so authenticating is not a write per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class ApiKeyRevoked(Exception):
    pass


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def api_key_create(*, owner, name: str) -> tuple[ApiKey, str]:
    """A new key for `owner`. Returns the row and the secret, which is never stored and so can
    never be shown again. (A person creating one for someone is engine.actions.api_keys: audited.)"""
    prefix = secrets.token_hex(PREFIX_LENGTH // 2)
    token = f"{KEY_SCHEME}_{prefix}_{secrets.token_urlsafe(32)}"
    api_key = ApiKey.objects.create(owner=owner, name=name.strip()[:100] or "unnamed", prefix=prefix,
                                    secret_hash=_hash(token))
    return api_key, token


def api_key_revoke(*, api_key: ApiKey) -> bool:
    """Revoke for good; False if it already was."""
    now = timezone.now()
    if not ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(revoked_at=now):
        return False
    api_key.revoked_at = now
    return True


def _parse(token: str) -> str | None:
    scheme, _, rest = token.partition("_")
    prefix, _, secret = rest.partition("_")
    if scheme != KEY_SCHEME or len(prefix) != PREFIX_LENGTH or not secret:
        return None
    if any(c not in "0123456789abcdef" for c in prefix):
        return None
    return prefix


@cache
def _lookup_sql() -> tuple[str, list[str]]:
    """The key, its owner and the owner's permission names in one round trip. Written once as
    SQL: this runs on every API request, and compiling the equivalent ORM query (two array
    subqueries) costs more than executing it."""
    User = get_user_model()
    user_table = User._meta.db_table
    user_fields = [field.attname for field in User._meta.concrete_fields]
    columns = ", ".join(f'u."{field.column}"' for field in User._meta.concrete_fields)
    sql = f"""
        SELECT k.id, k.prefix, k.secret_hash, k.revoked_at, k.last_used_at,
            ARRAY(
                SELECT ct.app_label || '.' || p.codename FROM auth_user_user_permissions up
                JOIN auth_permission p ON p.id = up.permission_id JOIN django_content_type ct ON ct.id = p.content_type_id
                WHERE up.user_id = k.owner_id
                UNION
                SELECT ct.app_label || '.' || p.codename FROM auth_user_groups ug
                JOIN auth_group_permissions gp ON gp.group_id = ug.group_id
                JOIN auth_permission p ON p.id = gp.permission_id JOIN django_content_type ct ON ct.id = p.content_type_id
                WHERE ug.user_id = k.owner_id
            ),
            {columns}
        FROM {ApiKey._meta.db_table} k JOIN "{user_table}" u ON u."{User._meta.pk.column}" = k.owner_id
        WHERE k.prefix = %s
    """
    return sql, user_fields


def api_key_authenticate(*, token: str):
    """The active user a presented key belongs to, or None for an unknown key. Raises
    ApiKeyRevoked for a revoked key, so a client can tell "rotate" from "typo". The user
    comes with its permissions loaded: has_perm() needs no further query."""
    prefix = _parse(token.strip())
    if prefix is None:
        return None
    sql, user_fields = _lookup_sql()
    with connection.cursor() as cursor:
        cursor.execute(sql, [prefix])
        row = cursor.fetchone()
    if row is None:
        return None
    key_id, _, secret_hash, revoked_at, last_used_at, permissions = row[:6]
    if not hmac.compare_digest(secret_hash, _hash(token.strip())):
        return None
    if revoked_at is not None:
        raise ApiKeyRevoked(f"API key {prefix} was revoked")
    owner = get_user_model().from_db(connection.alias, user_fields, row[6:])
    if not owner.is_active:
        return None
    # ModelBackend's own per-user cache (what get_all_permissions would fill with two queries).
    owner._perm_cache = set(permissions)
    # Which key it was: the API's per-key rate limit counts by it (config/throttling.py).
    owner.api_key_id = key_id
    now = timezone.now()
    if last_used_at is None or now - last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=key_id).update(last_used_at=now)
    return owner
