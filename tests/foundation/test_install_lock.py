"""Reproducible installs: requirements.lock pins every package of the dependency set, test extras
and build backend included, each with its hashes; the pins satisfy pyproject.toml's ranges (the
source the lock is compiled from); `make setup` installs from the lock with hashes required; and
this suite runs on exactly the locked versions."""

import re
import subprocess
import tomllib
from importlib.metadata import PackageNotFoundError, version

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.processes import ROOT

LOCK = ROOT / "requirements.lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\]+)((?:\s*\\\n\s+--hash=sha256:[0-9a-f]{64})+)", re.M)


def locked() -> dict[str, str]:
    return {canonicalize_name(name): pinned for name, pinned, _ in PIN.findall(LOCK.read_text())}


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [Requirement(r) for r in (*project["project"]["dependencies"], *project["project"]["optional-dependencies"]["test"],
                                     *project["build-system"]["requires"])]


def test_every_requirement_line_is_pinned_with_hashes():
    text = LOCK.read_text()
    requirement_lines = [line for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    assert requirement_lines, "requirements.lock lists nothing"
    assert len(requirement_lines) == len(PIN.findall(text)), [line for line in requirement_lines if "==" not in line]
    assert "://" not in text, "the lock must not name an index or a local path"


def test_the_lock_covers_pyproject_with_versions_its_ranges_allow():
    pins = locked()
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in requirements.lock: run `make lock`"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {requirement}"
    assert {"pytest", "schemathesis", "playwright", "setuptools"} <= set(pins)  # test extras and the build backend


def test_make_setup_installs_from_the_lock_with_hashes_required():
    plan = subprocess.run(["make", "-n", "-B", "setup"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    installs = [line for line in plan.splitlines() if "pip install" in line]
    assert installs[0].endswith("install --quiet --require-hashes --no-deps -r requirements.lock"), installs
    # The project itself adds nothing: no dependency, no build backend fetched from the index.
    assert installs[1:] == [installs[1]] and "--no-deps --no-build-isolation ." in installs[1], installs


def test_the_suite_runs_on_the_locked_versions():
    text = LOCK.read_text()
    runtime = text.split("# The following packages are considered to be unsafe", 1)[0]  # not the build backend
    drift = {}
    for name, pinned, _ in PIN.findall(runtime):
        try:
            installed = version(name)
        except PackageNotFoundError:
            installed = None
        if installed != pinned:
            drift[name] = (pinned, installed)
    assert drift == {}, f"installed versions differ from requirements.lock (run `make setup`): {drift}"
