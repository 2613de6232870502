"""`make run` (manage.py serve_all) stops everything it started: Ctrl-C in a terminal signals its
whole foreground process group, a service manager sends SIGTERM to the process it started; either
way no web server, simulator, worker, sentinel or sweeper is left once serve_all has exited."""

import os
import signal
import sys
from pathlib import Path

import pytest

from operations.models import ProcessHeartbeat, ProcessRole
from tests.support.processes import ProcessGroup, descendants, free_port_pair, wait_for

pytestmark = pytest.mark.processes


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent's reaping is left


@pytest.fixture
def group(transactional_db, request):
    processes = ProcessGroup(name=request.node.name[:60])
    yield processes
    processes.stop_all()


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_serve_all_leaves_no_process_behind(group, how):
    port = free_port_pair()
    group.base_env.pop("WARDEN_SIM_BASE_URL", None)  # serve_all points the demo tools at its own simulator
    serve_all = group.start("serve_all", [sys.executable, "manage.py", "serve_all", "--host", "127.0.0.1", "--port", str(port)],
                            env={"WARDEN_WORKERS": "2"})
    wait_for(lambda: ProcessGroup._listening(port) and ProcessGroup._listening(port + 1), timeout=120,
             message="the web server and the simulator to accept connections")
    wait_for(lambda: ProcessHeartbeat.objects.filter(role=ProcessRole.WORKER).count() >= 2, timeout=120,
             message="both workers of the cluster to report")
    wait_for(lambda: ProcessHeartbeat.objects.filter(role=ProcessRole.SWEEPER).exists(), timeout=120,
             message="the sweeper to report")
    # daphne ×2, the cluster's parent, sentinel, monitor, pusher and two workers, the sweeper: the
    # workers report before the cluster has started every one of its own (a busy machine shows it).
    wait_for(lambda: len(descendants(serve_all.pid)) >= 9, timeout=120, message="serve_all's nine processes")
    started = descendants(serve_all.pid)

    if how == "ctrl-c":
        os.killpg(serve_all.pid, signal.SIGINT)  # what a terminal does: the foreground group
    else:
        serve_all.send_signal(signal.SIGTERM)  # what a service manager does: the process it started
    wait_for(lambda: serve_all.poll() is not None, timeout=60, message="serve_all to exit")
    assert serve_all.returncode == 0
    assert not [pid for pid in started if _running(pid)], "serve_all exited and left processes running"


@pytest.mark.django_db(transaction=True)
def test_serve_all_on_other_ports_points_the_demos_webhooks_and_links_at_itself(group):
    """Issue 27, finding 12: `serve_all --port N` left the demo's webhook endpoint and public links on
    the default ports, so another instance on the machine received this one's signed webhooks."""
    import httpx

    from demo.accounts import DEMO_WEBHOOK_ENDPOINT
    from notifications.models import NotificationKind, WebhookEndpoint

    WebhookEndpoint.objects.create(name=DEMO_WEBHOOK_ENDPOINT, url="http://127.0.0.1:8001/sim/webhooks/",
                                   kinds=[NotificationKind.RUN_FAILED])
    port = free_port_pair()
    for variable in ("WARDEN_SIM_BASE_URL", "WARDEN_PUBLIC_URL"):
        group.base_env.pop(variable, None)
    group.start("serve_all", [sys.executable, "manage.py", "serve_all", "--host", "127.0.0.1", "--port", str(port),
                              "--no-workers"])
    wait_for(lambda: ProcessGroup._listening(port + 1), timeout=120, message="the simulator to accept connections")
    wait_for(lambda: WebhookEndpoint.objects.get(name=DEMO_WEBHOOK_ENDPOINT).url == f"http://127.0.0.1:{port + 1}/sim/webhooks/",
             timeout=60, message="the demo's webhook endpoint to follow the simulator's port")
    # The receiver's page sends a visitor to this instance's login, not the default port's.
    answer = httpx.get(f"http://127.0.0.1:{port + 1}/sim/webhooks/", follow_redirects=False)
    assert answer.status_code == 302 and answer.headers["location"].startswith(f"http://127.0.0.1:{port}/admin/login/")
