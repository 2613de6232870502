"""A deployment's own agents and tools as tests exercise them: the example tool package and the
snippets of docs/EXTENDING.md (each checked by a test), agents defined through the one write path,
and waiting for a run to reach a state."""

import json
import re
from pathlib import Path

from engine.actions.agents import agent_save
from runs_app.models import Run
from tests.support.processes import wait_for

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


def define(definition: dict, *, by, agent=None):
    return agent_save(definition=definition, acting_user=by, agent=agent)



def run_state(run_id) -> tuple[str, str]:
    return tuple(Run.objects.filter(pk=run_id).values_list("status", "wait_reason").first() or ("", ""))


def wait_for_run(run_id, status: str, wait_reason: str = "", *, timeout: float = 120):
    return wait_for(lambda: run_state(run_id) == (status, wait_reason), timeout=timeout,
                    message=f"run {run_id} to be {status}/{wait_reason}")


# --- the ledger's credit under an agent's rules, caps and limits (SPEC §18) -----------------------------

def credit_clerk(slug: str, *, turns: list, limits: dict | None = None, write_caps: dict | None = None) -> dict:
    """An agent whose credits up to 10.00 need nobody (its rule), over that an operator."""
    return {
        "name": slug, "slug": slug, "instructions": "Credit what the customer asks.", "provider": "scripted",
        "tools": ["ledger_balance", "ledger_credit"],
        "approval_rules": {"ledger_credit": [{"when": "amount <= 10", "approval": "none"},
                                             {"when": "amount > 10", "approval": "operator"}]},
        "limits": limits or {}, "write_caps": write_caps or {},
        "provider_options": {"turns": turns},
    }


def credit(reference: str = "$message", amount: str = "9.00") -> dict:
    return {"name": "ledger_credit", "arguments": {"account": "acme", "amount": amount, "reference": reference}}
