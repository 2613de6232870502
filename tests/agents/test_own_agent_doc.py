"""docs/OWN_AGENT.md, followed as a new user follows it, with demo mode off (issue 28): its tool package
is written from the page into a directory outside the repository and made importable the way the
page says; its settings are sourced in a shell as written (only the database, the payouts API and
the model server are pointed at the test's); its commands make the users and operators, start
`serve_all` — the web server, real django-q2 workers, the sweeper — and its requests define the
agent and drive one run through the read and the write tool, approved by the page's operator. The
payout is booked once. A local HTTP server stands in for the payouts API, a fake OpenAI-compatible
server for the model. Every code block of the page is marked with what it is, and each is used here
or, where it cannot run (a clone, a second way to start), parsed and checked."""

import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from django.apps import apps
from django.contrib.auth.models import Group

from runs_app.models import RunStatus, WaitReason
from tests.support.agents import wait_for_run
from tests.support.fake_openai_server import FakeOpenAIServer
from tests.support.processes import ROOT, ProcessGroup, free_port, wait_for
from tests.support.processes import test_database_url as database_url_of_the_tests
from tools_app.models import Resolution, ToolCall, ToolCallStatus

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = ROOT / "docs" / "OWN_AGENT.md"
_MARKED_BLOCK = re.compile(r"<!-- (\w+): ([^>]+?) -->\n```(\w+)\n(.*?)```", re.S)
SHIPPED_GROUPS = importlib.import_module("operations.migrations.0003_desk_groups")


def snippets() -> list[tuple[str, str, str, str]]:
    """(kind, name, language, text) of every marked code block of the page."""
    return [m.groups() for m in _MARKED_BLOCK.finditer(PAGE.read_text())]


def snippet(kind: str, name: str) -> str:
    (text,) = [text for k, n, _, text in snippets() if (k, n) == (kind, name)]
    return text


def commands(text: str) -> list[str]:
    """A shell snippet's commands: comments dropped, continued (quoted multi-line) commands joined."""
    found, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current = f"{current}\n{line}" if current else line
        try:
            shlex.split(current, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        found.append(current)
        current = ""
    return found


def with_this_python(command: str) -> str:
    """The page's `.venv/bin/python`, as the interpreter running the suite (the same virtualenv)."""
    return command.replace(".venv/bin/python", shlex.quote(sys.executable))


# --- the stand-ins: Acme's payouts API and the model ----------------------------------------------

class PayoutsApi(ThreadingHTTPServer):
    """The contract the page describes: balances, payouts booked once per Idempotency-Key, and the
    payout under a key. Every POST is counted."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _PayoutsHandler)
        self.owed = {"partner-7": "120.00"}
        self.payouts: dict[str, dict] = {}
        self.posts: list[dict] = []
        # Drop the connection after booking the first payout, before answering: "sent, no answer".
        self.drop_first_answer = False
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _PayoutsHandler(BaseHTTPRequestHandler):
    server: PayoutsApi

    def log_message(self, format, *args):
        pass

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urlsplit(self.path)
        if (match := re.fullmatch(r"/accounts/([^/]+)/balance", url.path)) and match[1] in self.server.owed:
            return self._answer(200, {"account": match[1], "owed": self.server.owed[match[1]], "currency": "EUR"})
        if url.path == "/payouts":
            key = parse_qs(url.query).get("idempotency_key", [""])[0]
            with self.server.lock:
                payout = self.server.payouts.get(key)
            return self._answer(200, payout) if payout else self._answer(404, {"error": "no payout under this key"})
        return self._answer(404, {"error": "not found"})

    def do_POST(self):
        if self.path != "/payouts" or not self.headers.get("Idempotency-Key"):
            return self._answer(400, {"error": "POST /payouts with an Idempotency-Key"})
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        key = self.headers["Idempotency-Key"]
        with self.server.lock:
            self.server.posts.append({"key": key, **body})
            first = key not in self.server.payouts
            if first:
                self.server.payouts[key] = {"id": f"po_{len(self.server.payouts) + 1}", "status": "paid", **body}
            payout = self.server.payouts[key]
            drop, self.server.drop_first_answer = self.server.drop_first_answer, False
        if drop:
            self.close_connection = True
            return
        self._answer(201 if first else 200, payout)


@pytest.fixture
def payouts_api():
    api = PayoutsApi()
    yield api
    api.shutdown()
    api.server_close()


@pytest.fixture
def model():
    with FakeOpenAIServer() as fake:
        yield fake


@pytest.fixture
def group(transactional_db, request):
    processes = ProcessGroup(name=request.node.name[:60])
    yield processes
    processes.stop_all()


# --- the page's parts ---------------------------------------------------------------------------------

@pytest.fixture
def written(tmp_path_factory) -> Path:
    """The page's files, written where it puts them — outside the repository."""
    place = tmp_path_factory.mktemp("own-agent")
    assert not place.is_relative_to(ROOT)
    for kind, name, _, text in snippets():
        if kind == "file":
            (place / name).parent.mkdir(parents=True, exist_ok=True)
            (place / name).write_text(text)
    return place


def fresh_shell(home: Path) -> dict[str, str]:
    """A new user's shell: none of the suite's settings (no demo mode, no test key, no database)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("WARDEN_", "DJANGO_", "OPENAI_", "PYTEST_")) and key not in ("SECRET_KEY", "DATABASE_URL", "REDIS_URL")}
    return {**env, "HOME": str(home)}


def page_settings(home: Path) -> dict[str, str]:
    """The environment after sourcing the page's settings in that shell."""
    sourced = subprocess.run(["bash", "-ec", snippet("shell", "settings") + "\nenv -0"], env=fresh_shell(home),
                             capture_output=True, text=True, timeout=60, check=True).stdout
    return dict(item.split("=", 1) for item in sourced.split("\0") if "=" in item)


def test_every_code_block_of_the_page_is_marked():
    blocks = re.findall(r"^```\w+$", PAGE.read_text(), re.M)
    assert len(snippets()) == len(blocks) and {kind for kind, *_ in snippets()} <= {"file", "shell"}
    for kind, name, language, text in snippets():
        if language == "sh":
            subprocess.run(["bash", "-n"], input=text, text=True, check=True)  # each shell snippet parses
        if language == "json":
            json.loads(text)


def test_the_settings_are_warden_settings_or_the_packages_own(tmp_path):
    settings_source = (ROOT / "config" / "settings.py").read_text()
    package = snippet("file", "acme-payouts/acme_payouts/tools.py")
    named = re.findall(r"^export (\w+)=", snippet("shell", "settings"), re.M)
    assert named and "WARDEN_DEMO" not in named
    for name in named:
        assert f'"{name}"' in settings_source or f'"{name}"' in package, f"{name} is read by neither Warden nor the package"
    sourced = page_settings(tmp_path)
    assert len(sourced["SECRET_KEY"]) >= 50 and sourced["WARDEN_TOOL_MODULES"] == "acme_payouts.tools"
    assert page_settings(tmp_path)["SECRET_KEY"] == sourced["SECRET_KEY"]  # made once, then kept


def test_the_install_commands_install_the_package(written):
    install = commands(snippet("shell", "install"))
    assert shlex.split(install[0], comments=True) == ["make", "setup-runtime"]
    plan = subprocess.run(["make", "-n", "setup-runtime"], cwd=ROOT, capture_output=True, text=True)
    assert plan.returncode == 0, plan.stderr
    pip = shlex.split(install[1], comments=True)
    assert pip[:3] == [".venv/bin/pip", "install", "-e"]
    # The package as the page lays it out is installable (resolved and built, not installed here:
    # the suite's virtualenv is not this test's to change; the run below uses the PYTHONPATH way).
    checked = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation", "-e",
                              str(written / "acme-payouts")], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0 and "Would install acme-payouts-0.1.0" in checked.stdout, checked.stdout + checked.stderr
    assert 'export PYTHONPATH="$PWD/../acme-payouts"' in install[1]


def test_a_typo_in_the_tool_modules_is_refused_as_the_page_says(written, tmp_path):
    env = {**page_settings(tmp_path), "DATABASE_URL": database_url_of_the_tests(), "PYTHONPATH": str(written / "acme-payouts"),
           "WARDEN_TOOL_MODULES": "acme_payouts.tool"}
    result = subprocess.run([sys.executable, "manage.py", "migrate", "--check"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    quoted = re.search(r"\(`(warden: WARDEN_TOOL_MODULES names .+?) …`\)", PAGE.read_text().replace("\n", " "))[1]
    assert result.stderr.startswith(quoted), (quoted, result.stderr)


@pytest.mark.processes
@pytest.mark.parametrize("payouts_answer", ["answered", "dropped"])
def test_the_pages_agent_runs_through_real_workers_with_demo_mode_off(written, tmp_path, payouts_api, model, group, payouts_answer):
    """`dropped`: the payouts API books the payout and drops the connection before answering — the
    page's ToolOutcomeUnknown; Warden's sweeper asks `payout_reconcile`, which finds it booked."""
    payouts_api.drop_first_answer = payouts_answer == "dropped"
    env = {**page_settings(tmp_path),
           # What the test points elsewhere: its database, its payouts API, its model server.
           "DATABASE_URL": database_url_of_the_tests(), "ACME_PAYOUTS_URL": payouts_api.url, "OPENAI_BASE_URL": model.base_url,
           # The package is importable the page's second way (the first, pip install -e, is checked above).
           "PYTHONPATH": str(written / "acme-payouts"), "PYTHONUNBUFFERED": "1"}
    assert "WARDEN_DEMO" not in env and "acme_payouts" not in sys.modules

    # Users and operators, as the page makes them (the test database lost the shipped groups to an
    # earlier test's flush; the migration makes them again).
    if Group.objects.filter(name__in=SHIPPED_GROUPS.ROLES).count() != len(SHIPPED_GROUPS.ROLES):
        SHIPPED_GROUPS.groups_create(apps, None)
    made = subprocess.run(["bash", "-ec", with_this_python(snippet("shell", "users"))], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    oscar = apps.get_model("auth", "User").objects.get(username="oscar")
    assert oscar.is_staff and oscar.has_perm("approvals_app.decide_approval")

    # serve_all, as the page starts it, on a free port.
    port = free_port()
    (start,) = commands(snippet("shell", "start"))
    group.base_env = env
    serve_all = group.start("serve_all", shlex.split(with_this_python(start).replace("--port 8000", f"--port {port}")))
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: ProcessGroup._listening(port) or serve_all.poll() is not None, timeout=120, message="serve_all's web server")
    assert serve_all.poll() is None, f"serve_all exited with {serve_all.returncode} (test-artifacts/process-logs)"
    assert not ProcessGroup._listening(port + 1), "a simulator started outside demo mode"

    # The model's part: look up the balance, pay it out, say so.
    model.enqueue(tool_calls=[{"id": "call_1", "name": "payout_balance", "arguments": json.dumps({"account": "partner-7"})}],
                  finish="tool_calls")
    model.enqueue(tool_calls=[{"id": "call_2", "name": "payout_send", "arguments": json.dumps(
        {"account": "partner-7", "amount": "120.00", "reference": "P-1001"})}], finish="tool_calls")
    model.enqueue(text=["Paid 120.00 EUR to partner-7 for invoice P-1001."], finish="stop")

    keys, ids = {}, {}
    with httpx.Client(base_url=base, timeout=30, trust_env=False) as http:
        def replay(command: str) -> httpx.Response:
            """One of the page's curl commands, sent as curl would send it."""
            for placeholder, value in ids.items():
                command = command.replace(placeholder, value)
            words = shlex.split(command.replace("localhost:8000", base))
            assert words[0] == "curl"
            method, headers, body = "GET", {}, None
            for flag, value in zip(words, words[1:]):
                if flag == "-X":
                    method = value
                elif flag == "-H":
                    name, _, text = value.partition(": ")
                    headers[name] = re.sub(r"\$(\w+)", lambda m: keys[m[1]], text)
                elif flag == "-d":
                    body = (written / value[1:]).read_text() if value.startswith("@") else value
            url = next(word for word in words if word.startswith(base))
            assert "<" not in url, url
            return http.request("POST" if body is not None and method == "GET" else method, url, headers=headers, content=body)

        for command in commands(snippet("shell", "agent")) + commands(snippet("shell", "try")):
            if assignment := re.fullmatch(r"(\w+)=\$\((.+)\)", command):
                key = subprocess.run(["sh", "-c", with_this_python(assignment[2])], cwd=ROOT, env=env,
                                     capture_output=True, text=True, timeout=120)
                assert key.returncode == 0 and key.stdout.startswith("wdn_"), key.stderr
                keys[assignment[1]] = key.stdout.strip()
                continue
            if re.search(r"localhost:8000/api/v1/approvals\s", command):
                wait_for_run(ids["<run id>"], RunStatus.WAITING, WaitReason.APPROVAL)
            answer = replay(command)
            assert 200 <= answer.status_code < 300, (command, answer.status_code, answer.text)
            body = answer.json()
            if "/api/v1/sessions -H" in command:
                ids["<session id>"] = body["id"]
            elif "/messages" in command:
                ids["<run id>"] = body["run"]["id"]
            elif re.search(r"localhost:8000/api/v1/approvals\s", command):
                (pending,) = [a for a in body["items"] if a["run_id"] == ids["<run id>"]]
                assert pending["can_decide"] and pending["rule"].startswith("payout_send[1]: amount <= 1000")
                ids["<approval id>"] = pending["id"]
            elif "/decision" in command:
                wait_for_run(ids["<run id>"], RunStatus.COMPLETED, "")
            elif "/api/v1/runs/" in command:
                assert body["status"] == RunStatus.COMPLETED and body["agent"]["slug"] == "payout-clerk"

    calls = {call.tool_name: call for call in ToolCall.objects.filter(run_id=ids["<run id>"])}
    assert set(calls) == {"payout_balance", "payout_send"}
    if payouts_answer == "dropped":  # unknown, then settled by the sweeper's call of payout_reconcile
        sent = calls["payout_send"]
        assert sent.resolution == Resolution.APPLIED and sent.resolved_by_id is None, (sent.resolution, sent.evidence)
        assert "payout found by idempotency key" in sent.evidence
    else:
        assert calls["payout_send"].resolution == ""
    assert all(call.status == ToolCallStatus.SUCCEEDED for call in calls.values())
    assert calls["payout_balance"].result == {"account": "partner-7", "owed": "120.00", "currency": "EUR"}
    # The write happened once, downstream, under Warden's idempotency key (the business key).
    key = "payout_send:payout:partner-7:P-1001"
    assert [post["key"] for post in payouts_api.posts] == [key]
    assert payouts_api.payouts[key] | {"id": None} == {"id": None, "status": "paid", "account": "partner-7", "amount": "120.00",
                                                      "currency": "EUR", "reference": "P-1001"}
    assert calls["payout_send"].result["id"] == payouts_api.payouts[key]["id"]
    # The model was offered the agent's tools, and only them (besides ask_user).
    offered = {tool["function"]["name"] for tool in model.requests[0]["tools"]}
    assert offered == {"ask_user", "payout_balance", "payout_send"}
