"""End-to-end scenes: real web server, workers and sweeper (the engine tests' fixtures), a
customer asking for a refund, and an operator who decides in the admin over real HTTP."""

import re

import httpx
import pytest
from django.contrib.auth.models import Permission

from approvals_app.models import Approval, ApprovalStatus
from runs_app.models import Run, RunStatus, WaitReason
from engine.actions.messages import message_post
from sessions_app.services import session_create
from tests.engine.conftest import demo_world, procs  # noqa: F401 - the same real-process fixtures
from tests.factories import TEST_PASSWORD, UserFactory
from tests.support.processes import wait_for

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
    session = session_create(owner=customer, title="refund 9527")
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
