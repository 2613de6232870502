"""CI runs the README's `make test` as a new user does: its full pass has neither DATABASE_URL nor
REDIS_URL (the embedded PostgreSQL, the PostgreSQL channel layer), and only the tests marked
`redis` run in a pass of their own with REDIS_URL set. Checked by running .ci/run itself, with
`make` and the machine's services replaced by recorders, in a shell that exports both variables
(as a CI machine might)."""

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RECORDER = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["RECORD"], "a") as out:
    out.write(json.dumps({"argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]],
                          "DATABASE_URL": os.environ.get("DATABASE_URL"),
                          "REDIS_URL": os.environ.get("REDIS_URL")}) + "\\n")
"""


def _recorder(path: Path) -> None:
    path.write_text(RECORDER)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_ci_with_recorders(tmp_path: Path) -> list[dict]:
    checkout = tmp_path / "clone"
    shutil.copytree(ROOT / ".ci", checkout / ".ci")
    (checkout / ".venv" / "bin").mkdir(parents=True)
    _recorder(checkout / ".venv" / "bin" / "python")
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("make", "chromium", "pg_isready", "redis-cli", "apt-get", "pg_ctlcluster", "redis-server"):
        _recorder(tools / name)
    record = tmp_path / "record.jsonl"
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "RECORD": str(record),
           "DATABASE_URL": "postgres://somebody@db.example/elsewhere", "REDIS_URL": "redis://cache.example/0"}
    subprocess.run(["bash", str(checkout / ".ci" / "run")], env=env, check=True, timeout=60)
    return [json.loads(line) for line in record.read_text().splitlines()]


def test_the_full_pass_sets_neither_variable_and_only_the_redis_tests_run_with_redis(tmp_path):
    calls = run_ci_with_recorders(tmp_path)
    passes = [call for call in calls if call["argv"][:2] == ["make", "test"]]
    full = [p for p in passes if "-m redis" not in " ".join(p["argv"])]
    redis = [p for p in passes if "-m redis" in " ".join(p["argv"])]
    assert len(full) == 1 and len(redis) == 1, passes
    assert full[0]["DATABASE_URL"] is None and full[0]["REDIS_URL"] is None, full[0]
    assert redis[0]["REDIS_URL"], redis[0]
    # The passes are counted against the whole suite at the end (.ci/count_passes.py), with REDIS_URL
    # set so that nothing is deselected from the count.
    counting = [call for call in calls if call["argv"][:2] == ["python", ".ci/count_passes.py"]]
    assert len(counting) == 1 and counting[0]["REDIS_URL"], calls
