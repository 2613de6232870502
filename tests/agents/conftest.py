"""Agents of a deployment: the example tool package registered the way a deployment registers
its own (WARDEN_TOOL_MODULES, in every process), agents defined through the one write path, and
the callers who define them."""

import importlib
import sys
from importlib import import_module

import pytest

from tests.support.agents import EXAMPLE_TOOLS
from tests.support.api import Api, grant
from tests.support.factories import ApiKeyFactory, UserFactory
from tools_app import registry

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


