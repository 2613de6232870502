"""Reproducible installs, in two (issue 28): requirements.lock pins the run-time and the build backend,
all `make run` installs; requirements-dev.lock pins the test and bench extras beside the same
run-time, every package both hold pinned alike (it is compiled against the first). Each pin carries
its hashes and satisfies pyproject.toml's ranges (the source both are compiled from); the Makefile
installs from them with hashes required, the run-time alone for `make run`, the extras (and the
client package) only for `make test` and the benchmarks, each install once; and this suite runs on
exactly the locked versions."""

import re
import shutil
import subprocess
import tomllib
from importlib.metadata import PackageNotFoundError, version

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.processes import ROOT

LOCK = ROOT / "requirements.lock"
DEV_LOCK = ROOT / "requirements-dev.lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\]+)((?:\s*\\\n\s+--hash=sha256:[0-9a-f]{64})+)", re.M)


def locked(lock=LOCK) -> dict[str, tuple[str, frozenset[str]]]:
    """Each package's pin and hashes."""
    return {canonicalize_name(name): (pinned, frozenset(re.findall(r"[0-9a-f]{64}", hashes)))
            for name, pinned, hashes in PIN.findall(lock.read_text())}


def declared(*groups: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = {"runtime": project["project"]["dependencies"], "build": project["build-system"]["requires"],
             **project["project"]["optional-dependencies"]}
    return [Requirement(r) for group in groups for r in found[group]]


def _assert_covers(lock, requirements: list[Requirement]) -> None:
    pins = locked(lock)
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in {lock.name}: run `make lock`"
        assert requirement.specifier.contains(pins[name][0], prereleases=True), f"{name}=={pins[name][0]} is outside {requirement}"


@pytest.mark.parametrize("lock", [LOCK, DEV_LOCK], ids=lambda lock: lock.name)
def test_every_requirement_line_is_pinned_with_hashes(lock):
    text = lock.read_text()
    requirement_lines = [line for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    assert requirement_lines, f"{lock.name} lists nothing"
    assert len(requirement_lines) == len(PIN.findall(text)), [line for line in requirement_lines if "==" not in line]
    assert "://" not in text, "a lock must not name an index or a local path"


def test_the_run_time_lock_covers_the_dependencies_and_nothing_of_the_extras():
    _assert_covers(LOCK, declared("runtime", "build"))
    extras_only = {canonicalize_name(r.name) for r in declared("test", "bench")} - {canonicalize_name(r.name) for r in declared("runtime")}
    assert extras_only & set(locked(LOCK)) == set(), "requirements.lock holds test or bench extras: `make run` would install them"
    assert {"pytest", "playwright", "schemathesis"}.isdisjoint(locked(LOCK))


def test_the_dev_lock_covers_the_extras_and_pins_the_shared_packages_as_the_run_time_lock():
    _assert_covers(DEV_LOCK, declared("runtime", "test", "bench"))
    runtime, dev = locked(LOCK), locked(DEV_LOCK)
    differing = {name: (runtime[name], dev[name]) for name in runtime.keys() & dev.keys() if runtime[name] != dev[name]}
    assert differing == {}, "the two locks pin a package differently: run `make lock`"
    assert {"pytest", "playwright", "schemathesis", "factory-boy", "websockets"} <= set(dev)


def _installs(target: str, cwd=ROOT, *, always: bool = True) -> list[str]:
    plan = subprocess.run(["make", "-n", *(["-B"] if always else []), target], cwd=cwd, capture_output=True, text=True, check=True).stdout
    return [line for line in plan.splitlines() if "pip install" in line]


def test_make_installs_from_the_locks_with_hashes_required():
    runtime = _installs("setup-runtime")
    assert runtime[0].endswith("install --quiet --require-hashes --no-deps -r requirements.lock"), runtime
    # The project itself adds nothing: no dependency, no build backend fetched from the index.
    assert len(runtime) == 2 and "--no-deps --no-build-isolation ." in runtime[1], runtime
    everything = _installs("setup")
    assert everything[:2] == runtime
    assert everything[2].endswith("install --quiet --require-hashes --no-deps -r requirements-dev.lock"), everything
    if (ROOT / "client" / "pyproject.toml").exists():
        assert everything[3:] == [everything[3]] and everything[3].endswith("--no-deps --no-build-isolation -e client"), everything
    # `make run` installs the run-time only; the tests and the benchmarks the extras too.
    assert _installs("run") == runtime
    assert _installs("test") == everything and _installs("bench") == everything


def test_each_install_happens_once_whatever_the_order(tmp_path):
    """`make run` after `make test` installs nothing; `make test` after `make run` only the extras."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("Makefile", "requirements.lock", "requirements-dev.lock"):
        shutil.copy(ROOT / name, checkout / name)
    if (ROOT / "client" / "pyproject.toml").exists():
        (checkout / "client").mkdir()
        shutil.copy(ROOT / "client" / "pyproject.toml", checkout / "client" / "pyproject.toml")
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / ".venv" / "bin" / "python").touch()
    assert len(_installs("run", checkout, always=False)) == 2  # a fresh clone: the run-time only

    (checkout / ".venv" / ".runtime-stamp").touch()  # what `make run` leaves
    assert _installs("run", checkout, always=False) == []
    extras = _installs("test", checkout, always=False)
    assert extras[0].endswith("-r requirements-dev.lock"), extras
    assert not [line for line in extras if line.endswith(("-r requirements.lock", " ."))], extras

    (checkout / ".venv" / ".installed-stamp").touch()  # what `make test` leaves
    assert _installs("run", checkout, always=False) == [] and _installs("test", checkout, always=False) == []


def test_the_suite_runs_on_the_locked_versions():
    drift = {}
    for lock in (LOCK, DEV_LOCK):
        runtime = lock.read_text().split("# The following packages are considered to be unsafe", 1)[0]  # not the build backend
        for name, pinned, _ in PIN.findall(runtime):
            try:
                installed = version(name)
            except PackageNotFoundError:
                installed = None
            if installed != pinned:
                drift[name] = (pinned, installed)
    assert drift == {}, f"installed versions differ from the locks (run `make setup`): {drift}"
