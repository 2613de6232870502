"""Demo mode is explicit (WARDEN_DEMO). Without it a deployment has no demo app, no demo tools,
no demo accounts or data and no /sim route anywhere; with it the simulated payment service — it
stands for an external system — answers only on a port of its own, never through the main
application (SPEC §15; issue 12, finding 1: `POST /sim/refunds` on the main app booked a refund
with no run and no approval)."""

import json
import os
import subprocess
import sys

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.support.factories import SimOrderFactory
from tests.support.processes import ROOT, ProcessGroup, free_port_pair, wait_for
from tests.support.processes import test_database_url as database_url_of_the_tests
from demo.models import SimOrder, SimRefund
from demo.selectors import sim_refund_count
from tools_app.registry import ASK_USER

# What a process of a deployment without demo mode finds; run in a subprocess with WARDEN_DEMO
# unset and the deployment's own settings module.
PROBE = r"""
import json

import django

django.setup()

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import Resolver404, resolve

from tools_app.registry import tool_list


def refusal(attempt):
    try:
        attempt()
    except (CommandError, ImproperlyConfigured) as error:
        return str(error)
    return None


def routed(path):
    try:
        resolve(path)
    except Resolver404:
        return False
    return True


print(json.dumps({
    "demo_mode": settings.WARDEN_DEMO,
    "demo_app_installed": apps.is_installed("demo"),
    "app_labels": sorted(config.label for config in apps.get_app_configs()),
    "tool_modules": settings.WARDEN_TOOL_MODULES,
    "tools": [tool.name for tool in tool_list()],
    "sim_routes": [path for path in ("/sim/refunds", "/sim/orders/9527", "/sim/faults", "/sim/") if routed(path)],
    "demo_setup": refusal(lambda: call_command("demo_setup")),
    "seed_demo": refusal(lambda: call_command("seed_demo")),
    "simulator_application": refusal(lambda: __import__("demo.asgi")),
    "default_agent": settings.WARDEN_DEFAULT_AGENT,
    "agents": list(apps.get_model("agents", "Agent").objects.values_list("slug", flat=True)),
}))
"""

REFUND = {"order_id": "9527", "amount": "25.00"}


def _without_demo_mode(env: dict[str, str]) -> dict[str, str]:
    env = {key: value for key, value in env.items() if key not in ("WARDEN_DEMO", "WARDEN_SIM_BASE_URL")}
    # A deployment brings its own signing key (outside demo mode the development one is no key).
    return {**env, "DJANGO_SETTINGS_MODULE": "config.settings", "DATABASE_URL": database_url_of_the_tests(),
            "SECRET_KEY": "a-deployment-without-demo-mode-has-its-own-key-" + "k" * 32}


@pytest.fixture
def group(transactional_db, request):
    processes = ProcessGroup(name=request.node.name[:60])
    yield processes
    processes.stop_all()


def _serve_all(group: ProcessGroup, *, demo: bool) -> int:
    port = free_port_pair()
    if not demo:
        group.base_env = _without_demo_mode(group.base_env)
    group.base_env.pop("WARDEN_SIM_BASE_URL", None)  # serve_all points the demo tools at its own simulator
    group.start("serve_all", [sys.executable, "manage.py", "serve_all", "--no-workers", "--host", "127.0.0.1", "--port", str(port)])
    wait_for(lambda: ProcessGroup._listening(port), timeout=60, message="the web server to accept connections")
    return port


def test_the_main_application_has_no_sim_route_even_in_demo_mode(db):
    """The finding's curl, against the main application's URLconf (the test suite runs in demo mode)."""
    SimOrderFactory(order_id="9527")
    client = Client()
    booked = client.post("/sim/refunds", json.dumps(REFUND), content_type="text/plain", headers={"Idempotency-Key": "x"})
    assert booked.status_code == 404
    assert client.get("/sim/orders/9527").status_code == 404
    assert client.get("/sim/faults").status_code == 404
    assert sim_refund_count(order_id="9527") == 0


def test_a_deployment_without_demo_mode_has_no_demo_app_tools_data_or_sim_route(transactional_db):
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=_without_demo_mode(dict(os.environ)),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["demo_mode"] is False
    assert found["demo_app_installed"] is False and "demo" not in found["app_labels"]
    assert found["tool_modules"] == [] and found["tools"] == [ASK_USER]  # only Warden's own built-in
    assert found["sim_routes"] == []
    # The demo world's commands are the demo app's: without it they do not exist.
    assert found["demo_setup"] == "Unknown command: 'demo_setup'" and found["seed_demo"] == "Unknown command: 'seed_demo'"
    assert "WARDEN_DEMO=1" in found["simulator_application"]
    # Refused, so nothing of the demo world was created: no demo accounts, no orders.
    assert not get_user_model().objects.filter(username__in=["operator", "alice"]).exists()
    assert not SimOrder.objects.exists()
    # No demo agent either, and no default agent a new session would get.
    assert found["default_agent"] == "" and found["agents"] == []


def test_the_demo_tools_cannot_be_named_without_demo_mode():
    env = {**_without_demo_mode(dict(os.environ)), "WARDEN_TOOL_MODULES": "demo.tools"}
    result = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "exist only in demo mode: set WARDEN_DEMO=1" in result.stderr


@pytest.mark.processes
def test_without_demo_mode_the_real_server_answers_404_at_sim_and_no_simulator_runs(group):
    port = _serve_all(group, demo=False)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, trust_env=False) as web:
        refund = web.post("/sim/refunds", content=json.dumps(REFUND), headers={"Idempotency-Key": "x", "Content-Type": "text/plain"})
        assert refund.status_code == 404
        assert web.get("/sim/orders/9527").status_code == 404
        assert web.get("/admin/login/").status_code == 200  # the server itself is up
    assert not ProcessGroup._listening(port + 1), "serve_all started a simulator outside demo mode"
    assert not SimRefund.objects.exists()


@pytest.mark.processes
def test_in_demo_mode_the_simulator_answers_only_on_its_own_port(group):
    SimOrderFactory(order_id="9527")
    port = _serve_all(group, demo=True)
    wait_for(lambda: ProcessGroup._listening(port + 1), timeout=60, message="the simulator to accept connections")
    with httpx.Client(timeout=10, trust_env=False) as http:
        web, sim = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"
        assert http.post(f"{web}/sim/refunds", json=REFUND, headers={"Idempotency-Key": "x"}).status_code == 404
        assert http.get(f"{web}/sim/orders/9527").status_code == 404
        assert sim_refund_count(order_id="9527") == 0
        assert http.get(f"{sim}/sim/orders/9527").json()["order_id"] == "9527"
        assert http.post(f"{sim}/sim/refunds", json=REFUND, headers={"Idempotency-Key": "x"}).status_code == 201
        # The simulator's server is the simulator and nothing else.
        assert http.get(f"{sim}/admin/login/").status_code == 404
        assert http.get(f"{sim}/api/v1/me").status_code == 404
    assert sim_refund_count(order_id="9527") == 1
