"""Login lockout (django-axes, its state in PostgreSQL) on both logins, the console's and the
admin's: failures count per username and per client address; at the limit every attempt — the
right password too — is refused with a page saying for how long, until the lockout ends."""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import F
from django.test import Client

from tests.support.factories import TEST_PASSWORD, UserFactory

pytestmark = pytest.mark.django_db

LOGINS = ["/console/login/", "/admin/login/"]


def attempt(login_url: str, username: str, password: str, *, address: str = "203.0.113.7"):
    return Client(REMOTE_ADDR=address).post(login_url, {"username": username, "password": password})


def logged_in(response) -> bool:
    return response.status_code == 302 and "sessionid" in response.cookies


def assert_locked_out(response):
    assert response.status_code == 429, response.content[:300]
    page = " ".join(response.content.decode().split())
    minutes = round(settings.AXES_COOLOFF_TIME.total_seconds() / 60)
    assert "Logins locked" in page and f"for {minutes} minutes" in page, page
    assert int(response["Retry-After"]) == settings.AXES_COOLOFF_TIME.total_seconds()
    assert "sessionid" not in response.cookies


def end_the_lockout():
    """As if the lockout period had passed since every attempt."""
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))


@pytest.mark.parametrize("login_url", LOGINS)
def test_forty_wrong_passwords_lock_the_account_and_the_right_one_waits_for_the_end(login_url):
    user = UserFactory(is_staff=True)
    answers = [attempt(login_url, user.username, f"guess-{n}") for n in range(40)]
    limit = settings.AXES_FAILURE_LIMIT
    assert all(a.status_code == 200 and not logged_in(a) for a in answers[: limit - 1])  # the form again
    for answer in answers[limit - 1:]:
        assert_locked_out(answer)
    # The right password, even from another address, is refused while the lockout lasts.
    assert_locked_out(attempt(login_url, user.username, TEST_PASSWORD, address="198.51.100.20"))
    end_the_lockout()
    assert logged_in(attempt(login_url, user.username, TEST_PASSWORD))


@pytest.mark.parametrize("login_url", LOGINS)
def test_one_address_guessing_many_usernames_is_locked_out_for_every_username(login_url):
    victim = UserFactory(is_staff=True)
    for n in range(settings.AXES_FAILURE_LIMIT):
        attempt(login_url, f"nobody-{n}", "guess", address="192.0.2.66")
    assert_locked_out(attempt(login_url, victim.username, TEST_PASSWORD, address="192.0.2.66"))
    assert logged_in(attempt(login_url, victim.username, TEST_PASSWORD, address="192.0.2.67"))


def test_a_lockout_on_one_login_holds_on_the_other():
    user = UserFactory(is_staff=True)
    for n in range(settings.AXES_FAILURE_LIMIT):
        attempt("/console/login/", user.username, f"guess-{n}", address=f"198.51.100.{n + 1}")
    assert_locked_out(attempt("/admin/login/", user.username, TEST_PASSWORD, address="198.51.100.200"))


def test_a_successful_login_clears_the_failures_before_it():
    user = UserFactory()
    for _ in range(3):
        for n in range(settings.AXES_FAILURE_LIMIT - 1):
            attempt("/console/login/", user.username, f"guess-{n}")
        assert logged_in(attempt("/console/login/", user.username, TEST_PASSWORD))
