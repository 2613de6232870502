"""The layering of docs/ARCHITECTURE.md holds: the import-linter contracts in pyproject.toml are
kept, they bite (a forbidden import is caught), every module sits in exactly one layer, no
project module takes part in an import cycle, and function-local imports are rare and
explained."""

import ast
import copy
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest
from importlinter.domain.helpers import module_expressions_to_modules
from importlinter.domain.imports import ModuleExpression

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
ROOTS = CONFIG["root_packages"]
CONTRACTS = {contract["id"]: contract for contract in CONFIG["contracts"]}
MAX_LOCAL_IMPORTS = 5


@pytest.fixture(scope="module")
def graph():
    sys.path.insert(0, str(ROOT))
    return grimp.build_graph(*ROOTS, cache_dir=None)


def _modules(graph, expressions) -> set[str]:
    """Every module an expression list names, with the descendants of the packages it names."""
    named = {m.name for m in module_expressions_to_modules(graph, [ModuleExpression(e) for e in expressions])}
    return {m for m in graph.modules if any(m == n or m.startswith(n + ".") for n in named)}


# Checking contracts against an altered graph runs in a clean interpreter: in the test process
# Django has imported Twisted (daphne), whose zope.interface declarations trip import-linter's
# introspection of its contract classes.
_CHECK_ALTERED = """
import copy, json, sys, tomllib
import grimp
from importlinter.configuration import configure
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.forbidden import ForbiddenContract
configure()
config = tomllib.load(open("pyproject.toml", "rb"))["tool"]["importlinter"]
contracts = {c["id"]: c for c in config["contracts"]}
graph = grimp.build_graph(*config["root_packages"], cache_dir=None)
def kept(contract_id, graph):
    options = {k: v for k, v in contracts[contract_id].items() if k not in ("id", "type", "name")}
    cls = {"forbidden": ForbiddenContract, "acyclic_siblings": AcyclicSiblingsContract}[contracts[contract_id]["type"]]
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
    ("runs_app.models", "engine.loop", "domain"),
    ("tools_app.services", "engine.actions.approvals", "domain"),
    ("sessions_app.access", "runs_app.api", "domain"),
    ("tools_app.demo.tools", "sessions_app.console.views", "domain"),
    ("engine.loop", "runs_app.admin", "orchestration"),
    ("engine.actions.runs", "config.api", "orchestration"),
    ("engine.checkpoint", "engine.loop", "engine-dag"),
    ("config.settings", "runs_app.models", "infrastructure"),
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


def test_every_module_is_in_exactly_one_layer(graph):
    forbidden = CONTRACTS["domain"]["forbidden_modules"]
    layers = {
        "domain": _modules(graph, CONTRACTS["domain"]["source_modules"]),
        "orchestration": _modules(graph, ["engine"]),
        "interfaces": _modules(graph, [m for m in forbidden if m != "engine"]),
        "infrastructure": _modules(graph, CONTRACTS["infrastructure"]["source_modules"]),
    }
    packages = set(ROOTS) | {"tools_app.demo", "runs_app.migrations", "sessions_app.console"}
    unplaced = sorted(m for m in graph.modules if m not in packages and not any(m in members for members in layers.values()))
    assert unplaced == [], f"modules in no layer (name them in pyproject.toml's contracts): {unplaced}"
    for first, members in layers.items():
        for second, others in layers.items():
            if first < second:
                assert not members & others, f"in both {first} and {second}: {sorted(members & others)}"


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
            for node in ast.walk(ast.parse(source)):
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
