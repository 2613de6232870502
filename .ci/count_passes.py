"""CI's last check: the passes of .ci/run together ran every test of the suite exactly once, and
none was skipped. Usage: count_passes.py <junit xml of a pass>... (run with REDIS_URL set, so the
collection below deselects nothing)."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter


def ran(path: str) -> tuple[list[str], int]:
    root = ElementTree.parse(path).getroot()
    cases = list(root.iter("testcase"))
    skipped = sum(1 for case in cases if case.find("skipped") is not None)
    return [f"{case.get('classname')}::{case.get('name')}" for case in cases], skipped


def junit_name(nodeid: str) -> str:
    """A collected test's id as junit XML names it (pytest's junitxml mangle_test_address)."""
    address, bracket, params = nodeid.partition("[")
    names = address.split("::")
    names[0] = names[0].replace("/", ".").removesuffix(".py")
    return f"{'.'.join(names[:-1])}::{names[-1]}{bracket}{params}"


def main(paths: list[str]) -> int:
    if not os.environ.get("REDIS_URL"):
        print("count_passes.py needs REDIS_URL set: without it the suite's Redis tests are deselected", file=sys.stderr)
        return 2
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                               capture_output=True, text=True, check=True).stdout
    # Some items share one id (schemathesis's one per API operation), so tests are counted by name.
    suite = Counter(junit_name(line) for line in collected.splitlines() if "::" in line)
    counts, skipped = Counter(), 0
    for path in paths:
        names, skips = ran(path)
        counts.update(names)
        skipped += skips
        print(f"{path}: {len(names)} tests, {skips} skipped")
    twice = counts - suite
    never = suite - counts
    print(f"together: {counts.total()} tests; the suite: {suite.total()}")
    if twice or never or skipped:
        print(f"FAILED: {twice.total()} ran twice, {never.total()} never ran, {skipped} skipped", file=sys.stderr)
        for name in sorted(twice):
            print(f"  ran twice: {name}", file=sys.stderr)
        for name in sorted(never):
            print(f"  never ran: {name}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
