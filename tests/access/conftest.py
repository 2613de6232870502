"""Real processes for the access tests: the console's fixtures (a daphne on the test database)."""

from tests.console.conftest import layer_for_this_process, procs  # noqa: F401 - fixtures
