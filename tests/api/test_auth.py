"""Authentication: API keys (hashed, shown once, revocable) for machines, the Django session
for browsers — with CSRF enforced on cookie-authenticated writes."""

import hashlib
import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from approvals_app.models import AuditEntry
from engine.actions.api_keys import api_key_withdraw as api_key_revoke
from sessions_app.models import ApiKey, Session
from tests.support.api import Api, revoked_key_api
from tests.support.factories import ApiKeyFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_bearer_key_authenticates_its_owner_and_records_last_use(alice):
    key = ApiKeyFactory(owner=alice)
    assert key.last_used_at is None
    response = Api(key.secret).get("/me")
    assert response.status_code == 200
    assert response.json()["username"] == "alice"
    key.refresh_from_db()
    assert key.last_used_at is not None


def test_only_a_hash_of_the_secret_is_stored(alice):
    key = ApiKeyFactory(owner=alice)
    row = ApiKey.objects.values().get(pk=key.pk)
    assert key.secret not in str(row)
    assert row["secret_hash"] == hashlib.sha256(key.secret.encode()).hexdigest()
    assert key.secret.startswith(f"wdn_{row['prefix']}_")


@pytest.mark.parametrize("authorization,code", [
    (None, "not_authenticated"),
    ("Bearer ", "invalid_api_key"),
    ("Bearer nonsense", "invalid_api_key"),
    ("Bearer wdn_0123456789ab_not-the-secret", "invalid_api_key"),
    ("Basic YWxpY2U6cHc=", "not_authenticated"),
])
def test_missing_or_wrong_credentials_are_401_json(alice, authorization, code):
    ApiKeyFactory(owner=alice)
    headers = {"HTTP_AUTHORIZATION": authorization} if authorization else {}
    response = Client().get("/api/v1/runs", **headers)
    assert response.status_code == 401
    assert response.json()["code"] == code


def test_a_wrong_secret_with_a_real_prefix_is_refused(alice):
    key = ApiKeyFactory(owner=alice)
    forged = key.secret[:-4] + ("AAAA" if not key.secret.endswith("AAAA") else "BBBB")
    assert Api(forged).get("/me").status_code == 401


def test_revoked_key_is_401_and_writes_nothing(alice, world):
    api = revoked_key_api(alice)
    sessions = Session.objects.count()
    response = api.post("/sessions", {"title": "after revocation"})
    assert response.status_code == 401
    assert response.json()["code"] == "api_key_revoked"
    assert Session.objects.count() == sessions
    assert api.post(f"/sessions/{world.session.pk}/messages", {"content": "hi"}).status_code == 401


def test_revoking_twice_is_harmless_and_audited_when_a_person_does_it(alice, api_operator):
    key = ApiKeyFactory(owner=alice)
    assert api_key_revoke(api_key=key, acting_user=api_operator) is True
    assert api_key_revoke(api_key=key, acting_user=api_operator) is False
    assert AuditEntry.objects.filter(action="revoke", object_type="apikey", object_id=str(key.pk)).count() == 1


def test_keys_of_an_inactive_user_do_not_authenticate(alice):
    key = ApiKeyFactory(owner=alice)
    alice.is_active = False
    alice.save(update_fields=["is_active"])
    assert Api(key.secret).get("/me").status_code == 401


def test_a_bad_key_is_refused_even_with_a_logged_in_browser_session(alice):
    client = Client()
    client.force_login(alice)
    response = client.get("/api/v1/me", HTTP_AUTHORIZATION="Bearer wdn_0123456789ab_wrong")
    assert response.status_code == 401


# --- the browser: Django session + CSRF -------------------------------------------------

def test_session_cookie_reads_need_no_csrf_token(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    response = client.get("/api/v1/me")
    assert response.status_code == 200
    assert response.json()["username"] == "alice"


def test_cookie_write_without_csrf_token_is_refused_403_json_and_writes_nothing(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    before = Session.objects.count()
    response = client.post("/api/v1/sessions", {"title": "forged"}, content_type="application/json")
    assert response.status_code == 403
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["code"] == "csrf_failed"
    assert Session.objects.count() == before


def test_cookie_write_with_the_csrf_token_succeeds(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    client.get("/admin/login/")  # any page rendering a form hands out the csrftoken cookie
    token = client.cookies["csrftoken"].value
    response = client.post("/api/v1/sessions", {"title": "mine"}, content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 201
    assert Session.objects.get(pk=response.json()["id"]).owner == alice


def test_bearer_writes_need_no_csrf_token(alice):
    client = Client(enforce_csrf_checks=True)
    response = Api(ApiKeyFactory(owner=alice).secret, client=client).post("/sessions", {"title": "machine"})
    assert response.status_code == 201


def test_anonymous_write_is_401_not_a_csrf_error():
    response = Client(enforce_csrf_checks=True).post("/api/v1/sessions", {"title": "x"}, content_type="application/json")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"


# --- creating keys: the management command and the admin --------------------------------

def test_create_api_key_command_prints_the_secret_once(alice):
    out, err = io.StringIO(), io.StringIO()
    call_command("create_api_key", "alice", "billing", stdout=out, stderr=err)
    secret = out.getvalue().strip()
    key = ApiKey.objects.get(owner=alice, name="billing")
    assert key.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert "cannot be shown again" in err.getvalue()
    assert Api(secret).get("/me").json()["username"] == "alice"


def test_create_api_key_command_refuses_unknown_users(db):
    with pytest.raises(CommandError):
        call_command("create_api_key", "nobody", "x", stdout=io.StringIO(), stderr=io.StringIO())


def test_staff_may_create_keys_only_for_themselves_and_creation_is_audited(alice):
    """A key acts as its owner: a key for the admin would let its creator decide refunds as them."""
    from django.contrib.auth.models import Permission

    operator = UserFactory(username="keymaker", is_staff=True)
    operator.user_permissions.add(*Permission.objects.filter(codename__in=["add_apikey", "view_apikey"]))
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(operator)
    refused = client.post("/admin/sessions_app/apikey/add/", {"owner": root.pk, "name": "as root"})
    assert refused.status_code == 200 and "only for yourself" in refused.content.decode()
    assert not ApiKey.objects.filter(owner=root).exists() and not AuditEntry.objects.filter(action="create").exists()
    client.post("/admin/sessions_app/apikey/add/", {"owner": operator.pk, "name": "mine"})
    key = ApiKey.objects.get(owner=operator)
    entry = AuditEntry.objects.get(action="create", object_id=str(key.pk))
    assert entry.actor == operator and entry.after["owner"] == operator.pk


def test_admin_creates_a_key_showing_the_secret_once_and_revokes_it(alice):
    admin_user = UserFactory(username="root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(admin_user)
    response = client.post("/admin/sessions_app/apikey/add/", {"owner": alice.pk, "name": "from the desk"})
    assert response.status_code == 200
    key = ApiKey.objects.get(name="from the desk")
    page = response.content.decode()
    secret = page.split('user-select:all">')[1].split("</code>")[0]
    assert key.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert "no-store" in response["Cache-Control"]
    assert secret not in client.get(f"/admin/sessions_app/apikey/{key.pk}/change/").content.decode()
    assert Api(secret).get("/me").status_code == 200

    client.post("/admin/sessions_app/apikey/", {"action": "revoke_keys", "_selected_action": [key.pk]})
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert Api(secret).get("/me").status_code == 401
    assert AuditEntry.objects.filter(action="revoke", actor=admin_user).exists()
