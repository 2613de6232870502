"""The state module (engine/state/) is the one writer of a run's state: nowhere else in the
application is a run's, a step's or a tool call's status, phase or wait reason written — by
assignment, by an ORM write, or by SQL — nor a `run_status` event payload built by hand
(docs/ARCHITECTURE.md, "One writer of a run's state"). Read-only SQL may stay with its reader."""

import ast
import re
from pathlib import Path

import tomllib

from tests.support.source import source_tree

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"]
STATE = ROOT / "engine" / "state"

STATE_FIELDS = {"status", "phase", "wait_reason"}
FENCED_MODELS = {"Run", "Step", "ToolCall"}
FENCED_TABLES = ("runs_app_run", "runs_app_step", "tools_app_toolcall", "runs_app_runevent")
SQL_WRITE = re.compile(r"\b(UPDATE|INSERT\s+INTO|DELETE\s+FROM)\s+\"?(" + "|".join(FENCED_TABLES) + r")\b", re.I)


def application_files() -> list[Path]:
    files = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts and STATE not in path.parents:
                files.append(path)
    return files


def _root_name(node: ast.AST) -> str:
    """The name a chain of attributes and calls starts from: `Run` for Run.objects.filter(...)."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def state_writes(path: Path) -> list[str]:
    source = path.read_text()
    name = path.relative_to(ROOT) if ROOT in path.parents else path.name
    found = [f"{name}:{source[:m.start()].count(chr(10)) + 1}: SQL {m.group(0)!r}" for m in SQL_WRITE.finditer(source)]
    for node in ast.walk(source_tree(source)):
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            written = {k.arg for k in node.keywords} & STATE_FIELDS
            if (node.func.attr in ("update", "create", "bulk_create", "get_or_create", "update_or_create") and written
                    and _root_name(node.func.value) in FENCED_MODELS):
                found.append(f"{where}: {_root_name(node.func.value)}….{node.func.attr}({', '.join(sorted(written))}=…)")
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            if {"status", "phase", "wait_reason"} <= keys:
                found.append(f"{where}: a run_status payload built by hand")
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (isinstance(target, ast.Attribute) and target.attr in STATE_FIELDS
                        and _root_name(target.value) in {"run", "step", "call", "tool_call", "row", "cp", "latest"}):
                    found.append(f"{where}: assigns {ast.unparse(target)}")
    return found


def test_nothing_outside_the_state_module_writes_a_runs_state():
    found = [line for path in application_files() for line in state_writes(path)]
    assert found == [], "writes of a run's state outside engine/state/:\n  " + "\n  ".join(found)


def test_the_check_finds_each_kind_of_write(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        'Run.objects.filter(pk=1).update(status="queued")\n'
        'ToolCall.objects.filter(pk=1).update(phase="x", attempts=2)\n'
        'payload = {"status": "running", "phase": "calling_model", "wait_reason": ""}\n'
        'run.wait_reason = "approval"\n'
        'cursor.execute(\'UPDATE "runs_app_step" SET "status" = %s\', [s])\n'
        'Approval.objects.filter(pk=1).update(status="approved")\n'  # not a run's state: allowed
    )
    found = state_writes(sample)
    assert len(found) == 5, found
    assert not any(":6:" in line for line in found)
