"""The test suite's settings: config/settings.py with what a test run needs and a fresh clone does
not have. Set in the environment (not here), so the servers and workers the tests start inherit
them, and a test that sets its own value for a process it starts keeps it."""

import os
import uuid
from pathlib import Path

# Demo mode: most tests drive the demo world's tools against its simulated payment service. The
# tests of a deployment without it start their subprocesses with WARDEN_DEMO removed.
os.environ["WARDEN_DEMO"] = "1"

# Outside DEBUG and demo mode Warden refuses its development key; tests get a key of their own.
os.environ.setdefault("SECRET_KEY", "tests-only-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz")
# The suite makes many requests as few users from one address; the rate-limit tests set low limits.
os.environ.setdefault("WARDEN_API_RATE_PER_KEY", "100000/min")
os.environ.setdefault("WARDEN_API_RATE_PER_USER", "100000/min")
os.environ.setdefault("WARDEN_API_WRITE_RATE_PER_USER", "100000/min")
# The suite's webhook receivers listen on this machine (notifications/targets.py refuses loopback otherwise).
os.environ.setdefault("WARDEN_WEBHOOK_ALLOWED_HOSTS", "127.0.0.1")
# The shared cache may be a Redis other test runs use too: this run's keys are its own.
os.environ.setdefault("WARDEN_CACHE_PREFIX", f"test-{uuid.uuid4().hex[:12]}")

# A parallel run (pytest-xdist, `make test`): with the embedded server (DATABASE_URL unset where the
# run began), each test process gets a PostgreSQL server of its own, in its own folder — transaction
# ids, advisory locks and the activity view are a whole server's, and the event feeds' commit-order
# barrier (runs_app/feeds.py) would otherwise wait on the other process's transactions. The first
# process to load these settings records whether the run began without DATABASE_URL, before
# config/settings.py sets it for child processes.
# The processes the tests start inherit the choice (WARDEN_TEST_SERVER_CHOSEN) and the test database's URL.
os.environ.setdefault("WARDEN_TEST_EMBEDDED_DB", "0" if os.environ.get("DATABASE_URL") else "1")
if (os.environ.get("PYTEST_XDIST_WORKER") and os.environ["WARDEN_TEST_EMBEDDED_DB"] == "1"
        and not os.environ.get("WARDEN_TEST_SERVER_CHOSEN")):
    os.environ["WARDEN_TEST_SERVER_CHOSEN"] = "1"
    os.environ.pop("DATABASE_URL", None)
    _pgdata = os.environ.get("WARDEN_EMBEDDED_PGDATA") or str(Path(__file__).resolve().parent.parent / ".warden" / "pgdata")
    os.environ["WARDEN_EMBEDDED_PGDATA"] = f"{_pgdata}-test-{os.environ['PYTEST_XDIST_WORKER']}"

from config.settings import *  # noqa: E402,F401,F403

# The PostgreSQL channel layer's alias (config/settings.py defines it only without REDIS_URL): the
# tests that put the layer itself under test use it whatever this shell exports (CI sets REDIS_URL).
DATABASES.setdefault("channels_postgres", {**DATABASES["default"], "TEST": {"MIRROR": "default"}})  # noqa: F405

# A web server the suite shares between tests (tests/support/processes.py) answers one more URL,
# which forgets what it cached about the previous test's (flushed) database.
if os.environ.get("WARDEN_TEST_SHARED_SERVER"):
    ROOT_URLCONF = "tests.support.shared_server"

# Password hashing is slow on purpose (PBKDF2, a million rounds: ~0.5 s a check here); the suite
# creates users and logs in by password thousands of times, in-process and in the servers it starts
# (they load these settings too). New hashes are MD5 in tests only; Django's hashers, the
# deployment's, still verify any hash made with them.
from django.conf import global_settings  # noqa: E402

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher", *global_settings.PASSWORD_HASHERS]
