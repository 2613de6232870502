"""Agents of a deployment: the example tool package registered the way a deployment registers
its own (WARDEN_TOOL_MODULES, in every process), agents defined through the one write path, and
the callers who define them."""

import importlib
import json
import re
import sys
from importlib import import_module
from pathlib import Path

import httpx
import pytest

from engine.actions.agents import agent_save
from runs_app.models import Run
from tests.api.conftest import Api, grant
from tests.engine.conftest import demo_world, procs  # noqa: F401 - the same real-process fixtures
from tests.factories import ApiKeyFactory, UserFactory
from tests.support.processes import wait_for
from tools_app import registry

ROOT = Path(__file__).resolve().parents[2]
EXTENDING = ROOT / "docs" / "EXTENDING.md"
EXAMPLE_TOOLS = "tests.support.example_tools.ledger"

_MARKED_BLOCK = re.compile(r"<!-- (\w+): ([^>]+?) -->\n```(\w+)\n(.*?)```", re.S)


def extending_snippets() -> list[tuple[str, str, str, str]]:
    """(kind, target, language, text) of every marked code block of docs/EXTENDING.md."""
    return [m.groups() for m in _MARKED_BLOCK.finditer(EXTENDING.read_text())]


def extending_snippet(kind: str, target: str):
    (text,) = [text for k, t, _, text in extending_snippets() if (k, t) == (kind, target)]
    return text


def ledger_agent_definition() -> dict:
    return json.loads(extending_snippet("request", "POST /api/v1/agents"))


def tool_modules_setting() -> str:
    return extending_snippet("setting", "WARDEN_TOOL_MODULES").strip().split("=", 1)[1]


@pytest.fixture
def example_tools():
    """This process imports the example package as WARDEN_TOOL_MODULES makes every Warden process
    do at start-up (its workers and web server get the setting itself); its registry is put back
    afterwards so no other test sees the tools."""
    saved = dict(registry._REGISTRY)
    # Imported once per process; a later test reloads it, which registers its tools again.
    module = importlib.reload(sys.modules[EXAMPLE_TOOLS]) if EXAMPLE_TOOLS in sys.modules else import_module(EXAMPLE_TOOLS)
    yield module
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
    registry._SCHEMAS = None


@pytest.fixture
def agent_admin(db):
    """An operator who may define agents."""
    return grant(UserFactory(username="agent-admin", is_staff=True), ("agents", "change_agent"), ("agents", "view_agent"))


@pytest.fixture
def agent_admin_api(agent_admin):
    return Api(ApiKeyFactory(owner=agent_admin).secret)


def define(definition: dict, *, by, agent=None):
    return agent_save(definition=definition, acting_user=by, agent=agent)


class HttpApi:
    """A machine client of the real web server: /api/v1 with a bearer key."""

    def __init__(self, base_url: str, user):
        self.client = httpx.Client(base_url=f"{base_url}/api/v1", timeout=30, trust_env=False,
                                   headers={"Authorization": f"Bearer {ApiKeyFactory(owner=user).secret}"})

    def post(self, path: str, body: dict):
        return self.client.post(path, json=body)

    def put(self, path: str, body: dict):
        return self.client.put(path, json=body)

    def get(self, path: str):
        return self.client.get(path)


def run_state(run_id) -> tuple[str, str]:
    return tuple(Run.objects.filter(pk=run_id).values_list("status", "wait_reason").first() or ("", ""))


def wait_for_run(run_id, status: str, wait_reason: str = "", *, timeout: float = 120):
    return wait_for(lambda: run_state(run_id) == (status, wait_reason), timeout=timeout,
                    message=f"run {run_id} to be {status}/{wait_reason}")
