"""The floor plan of docs/ARCHITECTURE.md holds: the import-linter contracts in pyproject.toml are
kept and they bite (a forbidden import is caught); every top-level folder of the project is one
layer, and drawn by folder every arrow runs down; no project module takes part in an import cycle;
function-local imports are rare and explained."""

import ast
import copy
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

from tests.support.source import source_tree

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
ROOTS = CONFIG["root_packages"]
CONTRACTS = {contract["id"]: contract for contract in CONFIG["contracts"]}
MAX_LOCAL_IMPORTS = 5


@pytest.fixture(scope="module")
def graph():
    sys.path.insert(0, str(ROOT))
    return grimp.build_graph(*ROOTS, cache_dir=None)


# Checking contracts against an altered graph runs in a clean interpreter: in the test process
# Django has imported Twisted (daphne), whose zope.interface declarations trip import-linter's
# introspection of its contract classes.
_CHECK_ALTERED = """
import copy, json, sys, tomllib
import grimp
from importlinter.configuration import configure
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.layers import LayersContract
from importlinter.contracts.protected import ProtectedContract
configure()
config = tomllib.load(open("pyproject.toml", "rb"))["tool"]["importlinter"]
contracts = {c["id"]: c for c in config["contracts"]}
graph = grimp.build_graph(*config["root_packages"], cache_dir=None)
def kept(contract_id, graph):
    options = {k: v for k, v in contracts[contract_id].items() if k not in ("id", "type", "name")}
    cls = {"layers": LayersContract, "acyclic_siblings": AcyclicSiblingsContract,
           "protected": ProtectedContract}[contracts[contract_id]["type"]]
    return cls(name=contract_id, session_options={"root_packages": config["root_packages"]},
               contract_options=options).check(graph, verbose=False).kept
results = []
for importer, imported, contract_id in json.loads(sys.argv[1]):
    altered = copy.deepcopy(graph)
    altered.add_import(importer=importer, imported=imported)
    results.append([kept(contract_id, graph), kept(contract_id, altered)])
print(json.dumps(results))
"""

FORBIDDEN_IMPORTS = [
    ("runs_app.models", "engine.loop", "layers"),  # the domain never imports orchestration
    ("tools_app.services", "engine.actions.approvals", "layers"),
    ("access.policy", "api.runs", "layers"),  # nor an interface
    ("engine.loop", "desk.runs", "layers"),  # orchestration never imports an interface
    ("engine.actions.runs", "api.v1", "layers"),
    ("desk.runs", "demo.client", "layers"),  # nothing imports the demo world
    ("api.runs", "console.views", "layers"),  # interfaces are independent of each other
    ("runs_app.selectors", "sessions_app.models", "layers"),  # the domain's order
    ("sessions_app.services", "agents.models", "layers"),
    ("notifications.outbox", "access.policy", "layers"),  # independent domain packages
    ("config.settings", "runs_app.models", "layers"),  # infrastructure imports no app
    ("engine.checkpoint", "engine.loop", "engine-dag"),
    ("api.runs", "engine.state", "state"),  # only orchestration writes a run's state
    ("desk.runs", "engine.state.runs", "state"),
]


def test_lint_imports_keeps_every_contract():
    result = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_a_forbidden_import_breaks_its_contract():
    result = subprocess.run([sys.executable, "-c", _CHECK_ALTERED, json.dumps(FORBIDDEN_IMPORTS)], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    for (importer, imported, contract_id), (before, after) in zip(FORBIDDEN_IMPORTS, json.loads(result.stdout)):
        assert before, f"{contract_id} should hold as the code stands"
        assert not after, f"adding {importer} → {imported} should break {contract_id}"


def _layer_of() -> dict[str, int]:
    """Each root package's level in the layers contract (0 at the top)."""
    levels = {}
    for level, entry in enumerate(CONTRACTS["layers"]["layers"]):
        for package in entry.replace(":", "|").split("|"):
            levels[package.strip()] = level
    return levels


def test_every_top_level_folder_of_the_project_is_one_layer():
    levels = _layer_of()
    assert sorted(levels) == sorted(ROOTS), "the layers contract names every root package, once"
    folders = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert folders == set(ROOTS), f"a Python package at the top that is in no layer: {sorted(folders - set(ROOTS))}"


def test_drawn_by_folder_every_arrow_runs_down(graph):
    """The folder graph: an arrow from folder A to folder B for every import between their modules.
    Each runs to a lower layer — never up, never sideways between independent layers — so no two
    domain apps import each other in both directions."""
    levels = _layer_of()
    arrows = {(m.split(".")[0], imported.split(".")[0]) for m in graph.modules
              for imported in graph.find_modules_directly_imported_by(m)}
    arrows = {(a, b) for a, b in arrows if a != b}
    wrong = sorted((a, b) for a, b in arrows if levels[a] >= levels[b])
    assert wrong == [], f"arrows that do not run down: {wrong}"
    assert not {(b, a) for a, b in arrows} & arrows


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), and self-imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(module: str) -> None:
        index[module] = low[module] = counter[0]
        counter[0] += 1
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1 or module in graph.find_modules_directly_imported_by(module):
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_among_project_modules(graph):
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle(graph):
    broken = copy.deepcopy(graph)
    broken.add_import(importer="runs_app.models", imported="engine.loop")
    assert any("runs_app.models" in cycle and "engine.loop" in cycle for cycle in _cycles(broken))


def _local_imports() -> list[tuple[str, int, str, str]]:
    """(file, line, module, reason) of every import of a project module inside a function."""
    found = []
    for root in ROOTS:
        for path in sorted((ROOT / root).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            source = path.read_text()
            lines = source.splitlines()
            for node in ast.walk(source_tree(source)):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for inner in ast.walk(node):
                    names = []
                    if isinstance(inner, ast.ImportFrom) and inner.module and inner.level == 0:
                        names = [inner.module]
                    elif isinstance(inner, ast.Import):
                        names = [alias.name for alias in inner.names]
                    for name in names:
                        if name.split(".")[0] in ROOTS:
                            line = lines[inner.lineno - 1]
                            reason = line.split("#", 1)[1].strip() if "#" in line else ""
                            found.append((str(path.relative_to(ROOT)), inner.lineno, name, reason))
    return found


def test_function_local_imports_are_few_and_each_says_why():
    local = _local_imports()
    assert len(local) <= MAX_LOCAL_IMPORTS, local
    unexplained = [entry for entry in local if len(entry[3]) < 10 or entry[3].startswith("noqa")]
    assert unexplained == [], f"a function-local import needs a one-line reason in a comment: {unexplained}"
