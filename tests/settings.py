"""The test suite's settings: config/settings.py with what a test run needs and a fresh clone does
not have. Set in the environment (not here), so the servers and workers the tests start inherit
them, and a test that sets its own value for a process it starts keeps it."""

import os
import uuid

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
