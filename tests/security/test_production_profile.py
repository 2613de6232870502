"""The production posture: the profile of docs/DEPLOYMENT.md passes `manage.py check --deploy`
with nothing to report; Warden refuses to start on its development key outside DEBUG and demo
mode, and says what to set; a real server answers only its own host names; every page carries a
Content-Security-Policy that allows nothing inline and nothing from another origin."""

import os
import re
import secrets
import subprocess
import sys

import pytest
from django.conf import settings
from django.test import Client

from tests.support.factories import UserFactory
from tests.support.raw_http import raw_get
from tests.support import processes
from tests.support.processes import ROOT, free_port

pytestmark = pytest.mark.django_db

DEPLOYMENT = ROOT / "docs" / "DEPLOYMENT.md"


def production_profile() -> dict[str, str]:
    """The variables of the profile block in docs/DEPLOYMENT.md, with its placeholders filled in."""
    text = DEPLOYMENT.read_text()
    block = text.split("# --- production profile ---", 1)[1].split("# --- end of production profile ---", 1)[0]
    profile = dict(line.split("=", 1) for line in block.strip().splitlines() if line and not line.startswith("#"))
    assert {"SECRET_KEY", "ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS", "WARDEN_HTTPS"} <= set(profile), profile
    placeholders = {name for name, value in profile.items() if "<" in value}
    assert placeholders <= {"SECRET_KEY", "DATABASE_URL", "REDIS_URL"}, placeholders
    return {**profile, "SECRET_KEY": secrets.token_urlsafe(50), "DATABASE_URL": processes.test_database_url(),
            "REDIS_URL": "redis://127.0.0.1:6379/15"}


def bare_environment(**variables: str) -> dict[str, str]:
    """A shell with nothing of this test run in it: no key, no DEBUG, no demo mode."""
    keep = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return {**keep, "DJANGO_SETTINGS_MODULE": "config.settings", "DATABASE_URL": processes.test_database_url(), **variables}


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_check_deploy_reports_nothing_under_the_production_profile():
    result = manage("check", "--deploy", "--fail-level", "DEBUG", env=bare_environment(**production_profile()))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout, result.stdout + result.stderr


def test_warden_refuses_to_start_on_the_development_key_and_says_what_to_set():
    refused = manage("check", env=bare_environment())
    assert refused.returncode != 0
    assert "Set SECRET_KEY to a long random value" in refused.stderr, refused.stderr[-2000:]
    server = subprocess.run(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(free_port()), "server.asgi:application"],
        cwd=ROOT, env=bare_environment(), capture_output=True, text=True, timeout=120,
    )
    assert server.returncode != 0 and "Set SECRET_KEY" in server.stderr, server.stderr[-2000:]
    # Where the development key is meant to work, it does.
    assert manage("check", env=bare_environment(WARDEN_DEMO="1")).returncode == 0
    assert manage("check", env=bare_environment(DEBUG="1")).returncode == 0


def test_allowed_hosts_default_to_the_local_server_only():
    shown = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import settings; print(settings.ALLOWED_HOSTS)"],
        cwd=ROOT, env=bare_environment(SECRET_KEY=secrets.token_urlsafe(50)), capture_output=True, text=True, timeout=120,
    )
    assert shown.stdout.strip() == "['127.0.0.1', 'localhost']", shown.stdout + shown.stderr


@pytest.mark.processes
def test_a_real_server_refuses_a_host_name_it_does_not_serve(procs):
    procs.base_env.pop("ALLOWED_HOSTS", None)
    procs.start_web()
    assert raw_get(procs.port, "/console/login/")[0] == 200
    for host in ("testserver", "evil.example"):
        assert raw_get(procs.port, "/console/login/", host=host)[0] == 400, host


def test_the_content_security_policy_allows_nothing_inline_and_no_other_origin():
    policy = settings.CONTENT_SECURITY_POLICY
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'" and directives["object-src"] == "'none'"
    assert "unsafe" not in policy and not re.search(r"https?:|\*", policy), policy


def test_every_page_carries_the_content_security_policy(alice_world):
    user, session, staff = alice_world
    customer, operator = Client(), Client()
    customer.force_login(user)
    operator.force_login(staff)
    pages = [
        (Client(), "/console/login/"), (Client(), "/admin/login/"), (Client(), "/api/v1/docs"),
        (Client(), "/api/v1/openapi.json"), (Client(), "/api/v1/me"), (Client(), "/console/no-such-page/"),
        (customer, "/console/"), (customer, f"/console/sessions/{session.pk}/"),
        (operator, "/admin/"), (operator, "/admin/approvals_app/approval/"), (operator, "/admin/runs_app/run/"),
    ]
    for client, path in pages:
        response = client.get(path)
        assert response.status_code < 500, (path, response.status_code)
        assert response["Content-Security-Policy"] == settings.CONTENT_SECURITY_POLICY, path


@pytest.fixture
def alice_world(db):
    from django.contrib.auth.models import Permission

    from engine.actions.sessions import session_open

    user = UserFactory(username="alice")
    staff = UserFactory(username="operator", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=["view_run", "view_approval", "decide_approval"]))
    return user, session_open(owner=user, title="refunds"), staff
