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


def main(paths: list[str]) -> int:
    if not os.environ.get("REDIS_URL"):
        print("count_passes.py needs REDIS_URL set: without it the suite's Redis tests are deselected", file=sys.stderr)
        return 2
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                               capture_output=True, text=True, check=True).stdout
    suite = sum(1 for line in collected.splitlines() if "::" in line)
    counts, skipped = Counter(), 0
    for path in paths:
        names, skips = ran(path)
        counts.update(names)
        skipped += skips
        print(f"{path}: {len(names)} tests, {skips} skipped")
    twice = [name for name, n in counts.items() if n > 1]
    total = sum(counts.values())
    print(f"together: {total} tests; the suite: {suite}")
    if twice or total != suite or skipped:
        print(f"FAILED: {len(twice)} ran in two passes, {suite - total} never ran, {skipped} skipped", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
