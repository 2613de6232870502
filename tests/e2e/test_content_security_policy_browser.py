"""Under the Content-Security-Policy every page still works in headless Chromium, at a desktop
and a phone size: the console (login, home, a session whose websocket goes live), the admin
(login, the desk, the queues, forms with the admin's own widgets) and the API's Swagger UI — and
the browser reports no violation anywhere (nothing inline is needed, nothing comes from a CDN).
Screenshots go to test-artifacts/screenshots/csp-*.png."""

import os
import shutil

import pytest

from tests.support.factories import TEST_PASSWORD, UserFactory
from tests.support.processes import ROOT

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
WAIT_MS = 90_000  # bounds a hung wait; nothing asserts how long anything took
VIEWPORTS = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}

# Every violation the page's documents report, kept in the page for the test to read.
VIOLATION_RECORDER = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(`${event.violatedDirective} ${event.blockedURI} ${event.sourceFile}:${event.lineNumber}`);
});
"""


@pytest.fixture
def chromium_path() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed; .ci/run installs it (apt-get install chromium)")
    pytest.skip("chromium is not installed locally (apt-get install -y chromium); CI installs it and never skips")


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
def test_console_admin_and_api_docs_work_under_the_policy(procs, chromium_path, viewport):
    customer = UserFactory(username="csp-customer")
    admin = UserFactory(username="csp-admin", is_staff=True, is_superuser=True)
    procs.start_web()
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop in this thread
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    refused: list[str] = []
    visited: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        context = browser.new_context(base_url=procs.base_url, viewport=VIEWPORTS[viewport])
        context.set_default_timeout(WAIT_MS)
        context.add_init_script(VIOLATION_RECORDER)
        page = context.new_page()
        page.on("console", lambda message: "Content Security Policy" in message.text and refused.append(message.text))

        def check(name: str) -> None:
            page.wait_for_load_state("load")
            visited.append(name)
            page.screenshot(path=str(SCREENSHOTS / f"csp-{name}-{viewport}.png"), full_page=True)
            violations = page.evaluate("window.__cspViolations")
            assert violations == [] and refused == [], (name, violations, refused)

        page.goto("/console/login/")
        check("console-login")
        page.fill('input[name="username"]', customer.username)
        page.fill('input[name="password"]', TEST_PASSWORD)
        page.click('button[type="submit"]')
        page.wait_for_url("**/console/")
        check("console-home")
        page.fill('input[name="title"]', "under the policy")
        page.click('[data-testid="new-session"]')
        page.wait_for_selector('[data-role="connection"][data-state="live"]')  # the websocket: connect-src 'self'
        check("console-session")

        page.goto("/admin/login/")
        check("admin-login")
        page.fill('input[name="username"]', admin.username)
        page.fill('input[name="password"]', TEST_PASSWORD)
        page.click('input[type="submit"]')
        page.wait_for_url("**/admin/")
        assert page.is_visible("#desk-overview")
        check("admin-desk")
        for name, path in [
            ("admin-approvals", "/admin/approvals_app/approval/"),
            ("admin-runs", "/admin/runs_app/run/"),
            ("admin-tool-calls", "/admin/tools_app/toolcall/"),
            ("admin-user-form", f"/admin/auth/user/{admin.pk}/change/"),  # the admin's widgets: filters, dates
            ("admin-api-key-form", "/admin/sessions_app/apikey/add/"),
        ]:
            assert page.goto(path).status == 200, path
            check(name)

        page.goto("/api/v1/docs")
        page.wait_for_selector(".swagger-ui .info .title")
        assert "Warden API" in page.inner_text(".swagger-ui .info .title")
        check("api-docs")
        browser.close()
    assert len(visited) == 11
