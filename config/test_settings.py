"""The test suite's settings: the deployment's own (config/settings.py) in demo mode, because most
tests drive the demo world's tools against its simulated payment service. The switch is set in the
environment, so the processes tests start (daphne, workers, the sweeper) are in demo mode too;
the tests of a deployment without it start their subprocesses with WARDEN_DEMO removed and
DJANGO_SETTINGS_MODULE=config.settings."""

import os

os.environ["WARDEN_DEMO"] = "1"

from config.settings import *  # noqa: E402,F403 - the deployment's settings, read with demo mode on
