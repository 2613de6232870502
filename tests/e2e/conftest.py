"""End-to-end scenes: real web server, workers and sweeper (the engine tests' fixtures), a
customer asking for a refund, and an operator who decides in the admin over real HTTP."""

import os
import re
import shutil

import httpx
import pytest
from django.contrib.auth.models import Permission
from django.db import connections
from django.test import override_settings

from approvals_app.models import Approval, ApprovalStatus
from runs_app.models import Run, RunStatus, WaitReason
from engine.actions.messages import message_post
from engine.actions.sessions import session_open
from tests.support.factories import TEST_PASSWORD, UserFactory
from tests.support.processes import ROOT, wait_for

REFUND_REQUEST = "Check order 9527 and refund it if it's eligible"


@pytest.fixture
def desk_operator(transactional_db):
    """An operator who may decide and reconcile, and log in with TEST_PASSWORD."""
    user = UserFactory(username="desk-operator", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
    user.user_permissions.add(*Permission.objects.filter(codename__in=["decide_approval", "reconcile_toolcall"]))
    return user


def refund_waiting_for_approval() -> tuple[Run, Approval]:
    """A customer asks for the refund; returns once the run is suspended on the operator."""
    customer = UserFactory(username="alice")
    session = session_open(owner=customer, title="refund 9527")
    run = message_post(session=session, content=REFUND_REQUEST, acting_user=customer).run
    wait_for(
        lambda: Run.objects.filter(pk=run.pk).exclude(status__in=[RunStatus.QUEUED, RunStatus.RUNNING]).exists(),
        timeout=60, message="the run to stop at the approval",
    )
    stored = Run.objects.get(pk=run.pk)
    assert (stored.status, stored.wait_reason) == (RunStatus.WAITING, WaitReason.APPROVAL), (stored.status, stored.error_detail)
    return stored, Approval.objects.get(run=stored, status=ApprovalStatus.PENDING)


def run_finished(run_id) -> bool:
    return Run.objects.filter(pk=run_id, status__in=[RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED]).exists()


class AdminOverHttp:
    """An operator's browser without the browser: a cookie session against the real server,
    every POST carrying the CSRF token of the form it submits."""

    def __init__(self, base_url: str):
        self.client = httpx.Client(base_url=base_url, follow_redirects=True, timeout=30, trust_env=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.client.close()

    @staticmethod
    def csrf_token_of(page: httpx.Response) -> str:
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert match, f"no CSRF token on {page.url}"
        return match.group(1)

    def login(self, username: str, password: str = TEST_PASSWORD) -> None:
        page = self.client.get("/admin/login/", params={"next": "/admin/"})
        response = self.client.post(
            "/admin/login/?next=/admin/",
            data={"username": username, "password": password, "next": "/admin/", "csrfmiddlewaretoken": self.csrf_token_of(page)},
        )
        assert response.status_code == 200 and response.url.path == "/admin/", (response.status_code, response.url)
        assert 'id="desk-overview"' in response.text

    def submit(self, path: str, data: dict) -> httpx.Response:
        """Open the page at `path` and post its form, as a person clicking the button would."""
        page = self.client.get(path)
        assert page.status_code == 200, (page.status_code, path)
        return self.client.post(path, data={**data, "csrfmiddlewaretoken": self.csrf_token_of(page)})


# --- browsers ------------------------------------------------------------------------------------

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
# The two screens every page is looked at on: a laptop and a phone.
VIEWPORTS = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}
# Bounds a hung wait (milliseconds); nothing asserts how long anything took.
BROWSER_WAIT_MS = 90_000


@pytest.fixture
def chromium():
    """Debian's chromium, headless, through Playwright (no browser download). While Playwright's
    sync API is active its loop counts as running in this thread: the ORM is allowed anyway."""
    path = "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else shutil.which("chromium")
    if not path:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed; .ci/run installs it (apt-get install chromium)")
        pytest.skip("chromium is not installed locally (apt-get install -y chromium)")
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
        # Opened while Playwright's loop ran (its context): not the ones pytest-django closes.
        connections.close_all()


def browser_page(chromium, base_url: str, size: str):
    context = chromium.new_context(base_url=base_url, viewport=VIEWPORTS[size])
    context.set_default_timeout(BROWSER_WAIT_MS)
    return context.new_page()


def login(page, path: str, username: str, password: str = TEST_PASSWORD) -> None:
    """Log in through `path`'s form (the desk's or the console's) and land where it leads."""
    page.goto(path)
    page.fill('input[name="username"]', username)
    page.fill('input[name="password"]', password)
    page.click('button[type="submit"], input[type="submit"]')
    page.wait_for_load_state("networkidle")


def screenshot(page, name: str, size: str) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"{name}-{VIEWPORTS[size]['width']}x{VIEWPORTS[size]['height']}.png"), full_page=True)


def scrolls_sideways(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth > document.documentElement.clientWidth")


def inside_viewport_horizontally(page, selector: str) -> bool:
    box = page.locator(selector).bounding_box()
    width = page.viewport_size["width"]
    return box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width


@pytest.fixture
def live_system(procs, demo_world):
    """The real processes around the test database; what this process publishes goes through the
    test database's channel layer, so the pages the browser shows hear about it."""
    from tests.support.console import postgres_layer_for_test_db, postgres_layer_pool_drop

    postgres_layer_pool_drop()
    with override_settings(CHANNEL_LAYERS=postgres_layer_for_test_db()):
        yield procs
    postgres_layer_pool_drop()
