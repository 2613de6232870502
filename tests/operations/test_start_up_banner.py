"""`make run`'s start-up banner links only pages that answer (issue 28): every URL `serve_all` prints
— the console, the desk, the API docs, health and metrics, and in demo mode the simulated payment
service and the demo's webhook receiver — fetched from the started servers once the system is up,
answers 2xx or 3xx, and a redirect ends on a page that answers 200."""

import re
import sys

import httpx
import pytest

from tests.support.processes import LOG_DIR, ProcessGroup, free_port_pair, wait_for

pytestmark = pytest.mark.processes

URL = re.compile(r"https?://[^\s,]+")


@pytest.fixture
def group(transactional_db, request):
    processes = ProcessGroup(name=request.node.name[:60])
    yield processes
    processes.stop_all()


def _answers(url: str, expected: tuple[int, ...] = (200,)) -> bool:
    try:
        return httpx.get(url, timeout=10, trust_env=False).status_code in expected
    except httpx.TransportError:
        return False


def test_every_url_the_banner_prints_answers(group):
    port = free_port_pair()
    group.base_env.pop("WARDEN_SIM_BASE_URL", None)  # serve_all points the demo at its own simulator
    log = LOG_DIR / f"{group.name}-serve_all.log"
    already = log.stat().st_size if log.exists() else 0  # the log is appended to across runs
    group.start("serve_all", [sys.executable, "manage.py", "serve_all", "--host", "127.0.0.1", "--port", str(port)],
                env={"WARDEN_WORKERS": "1"})

    def banner() -> str:
        text = log.read_bytes()[already:].decode(errors="replace") if log.exists() else ""
        start, end = text.find("Warden is starting:"), text.find("Press Ctrl-C to stop.")
        return text[start:end] if 0 <= start < end else ""

    printed = wait_for(banner, timeout=120, message="serve_all's banner")
    urls = URL.findall(printed)
    base = f"http://127.0.0.1:{port}"
    assert {f"{base}/console/", f"{base}/admin/", f"{base}/api/v1/docs", f"{base}/readyz", f"{base}/metrics"} <= set(urls), printed
    assert any(url.startswith(f"http://127.0.0.1:{port + 1}/sim") for url in urls), printed  # demo mode: the simulator

    # Up means ready: the web server, the simulator, a worker and the sweeper (readyz says so).
    wait_for(lambda: _answers(f"{base}/readyz") and _answers(f"http://127.0.0.1:{port + 1}/sim/webhooks/", (200, 302)),
             timeout=120, interval=0.5, message="the system to be ready")
    with httpx.Client(timeout=30, trust_env=False) as http:
        for url in urls:
            first = http.get(url)
            assert 200 <= first.status_code < 400, f"{url} answered {first.status_code}"
            final = http.get(url, follow_redirects=True)
            assert final.status_code == 200, f"{url} ends at {final.url}, which answered {final.status_code}"
