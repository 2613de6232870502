"""docs/EXTENDING.md's every snippet is exercised: each code block is marked with what checks it —
an excerpt of the example package (verbatim), the setting the process tests give the workers, or a
request body the tests send (tests/agents/test_bring_your_own_agent.py)."""

import json
import re

import pytest

from agents.definitions import agent_definition_check
from tests.support.agents import EXTENDING, ROOT, EXAMPLE_TOOLS, extending_snippets, ledger_agent_definition, tool_modules_setting

KINDS = {"excerpt", "setting", "request"}


def test_every_code_block_is_marked_with_what_exercises_it():
    blocks = re.findall(r"^```\w+$", EXTENDING.read_text(), re.M)
    snippets = extending_snippets()
    assert len(snippets) == len(blocks) and {kind for kind, *_ in snippets} <= KINDS


@pytest.mark.parametrize("snippet", [s for s in extending_snippets() if s[0] == "excerpt"], ids=lambda s: s[3].split("\n")[0][:40])
def test_each_code_excerpt_is_the_example_packages_code(snippet):
    _, path, language, text = snippet
    assert language == "python" and text in (ROOT / path).read_text()


def test_the_setting_names_the_example_package():
    assert tool_modules_setting() == EXAMPLE_TOOLS


def test_the_request_bodies_are_json_and_the_agent_definition_is_valid(example_tools):
    for kind, _, language, text in extending_snippets():
        if kind == "request":
            assert language == "json" and isinstance(json.loads(text), dict)
    assert agent_definition_check(ledger_agent_definition())["tools"] == ["ledger_balance", "ledger_credit"]
