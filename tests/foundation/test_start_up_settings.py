"""What a new user meets first (issue 28): a typo in WARDEN_TOOL_MODULES stops every command and the
web server in one line that names the setting, the module and why — not a 30-line traceback from
`migrate`; demo mode keeps its own tools whatever the setting adds; and the README's API example
gets a key in a fresh shell, where no SECRET_KEY is set."""

import os
import re
import subprocess
import sys

import pytest

from tests.support.processes import ROOT, free_port
from tests.support.processes import test_database_url as database_url_of_the_tests

pytestmark = pytest.mark.django_db(transaction=True)

KEY_OF_A_DEPLOYMENT = "a-deployment-without-demo-mode-has-its-own-key-" + "k" * 32


def _fresh_shell(**extra: str) -> dict[str, str]:
    """A shell as a new user has it: none of the suite's settings, the test database as the server."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("WARDEN_", "DJANGO_")) and key != "SECRET_KEY"}
    return {**env, "DATABASE_URL": database_url_of_the_tests(), **extra}


@pytest.mark.parametrize("command", [["manage.py", "migrate", "--check"], ["manage.py", "qcluster"]])
def test_a_tool_module_that_cannot_be_imported_stops_start_up_in_one_line(command):
    env = _fresh_shell(SECRET_KEY=KEY_OF_A_DEPLOYMENT, WARDEN_TOOL_MODULES="payout_tools.payoutz")
    result = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "WARDEN_TOOL_MODULES" in lines[0] and "'payout_tools.payoutz'" in lines[0]
    assert "No module named 'payout_tools'" in lines[0]


def test_the_web_server_refuses_the_same_way():
    env = _fresh_shell(SECRET_KEY=KEY_OF_A_DEPLOYMENT, WARDEN_TOOL_MODULES="tests.support.example_tools.no_such_module")
    port = free_port()
    result = subprocess.run([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "server.asgi:application"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "warden: WARDEN_TOOL_MODULES names 'tests.support.example_tools.no_such_module'" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_demo_mode_keeps_its_tools_whatever_the_setting_adds():
    env = _fresh_shell(WARDEN_DEMO="1", WARDEN_TOOL_MODULES="tests.support.example_tools.ledger")
    probe = ("import django; django.setup(); from tools_app.registry import tool_list; "
             "print(' '.join(sorted(tool.name for tool in tool_list())))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE": "config.settings"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    names = result.stdout.split()
    assert "execute_refund" in names  # the demo world's
    assert any(name.startswith("ledger_") for name in names), names  # the deployment's


def test_the_readmes_api_key_command_works_in_a_fresh_shell(django_user_model):
    django_user_model.objects.create_user("alice")
    readme = (ROOT / "README.md").read_text()
    (command,) = re.findall(r"^KEY=\$\((.+?)\)(?:\s+#.*)?$", readme, flags=re.MULTILINE)
    result = subprocess.run(["sh", "-c", command], cwd=ROOT, env=_fresh_shell(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"wdn_\S+", result.stdout.strip()), result.stdout
