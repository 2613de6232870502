"""The desk for a team on shift (issue 29): the pages where a write is decided — approve, reject,
record the outcome of an unknown call — show everything the decision needs: the customer's request,
the conversation, the tool's declared business fields with their currency, the agent's limit windows
with this call in them, and the earlier calls with the same business key. The desk's home puts the
operators' work first and the internals under "Administration", for superusers only; and the words
an operator reads are plain: "1 request", one expiry line, a budget cap named naturally."""

import html
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import strip_tags

from agents.selectors import tool_call_limit_windows
from approvals_app.models import Approval, ApprovalStatus
from runs_app.models import WaitReason
from tests.support.api import Api
from tests.support.desk import (
    REFUND_KEY, REFUND_LIMITS, csrf_client, csrf_token_of, messages_of, refund_clerk, refund_scene_with_history,
)
from tests.support.factories import ApiKeyFactory, ApprovalFactory, SessionFactory, UserFactory
from tools_app.models import ToolCallStatus

pytestmark = pytest.mark.django_db


def words(markup: str) -> str:
    """Markup as a person reads it: each tag a space, entities read, spaces collapsed."""
    return re.sub(r"\s+", " ", html.unescape(strip_tags(markup.replace("<", " <")))).strip()


def text_of(response) -> str:
    return words(response.content.decode())


def section(response, element_id: str) -> str:
    body = response.content.decode()
    start = body.index(f'id="{element_id}"')
    return words(body[start:body.index("</section>", start)])


@pytest.fixture
def clerk_version(db):
    return refund_clerk(by=UserFactory(username="agent-admin", is_staff=True), limits=REFUND_LIMITS)


@pytest.fixture
def pending_with_history(customer, clerk_version):
    scene = refund_scene_with_history(owner=customer, version=clerk_version, wait_reason=WaitReason.APPROVAL,
                                      refund_status=ToolCallStatus.PENDING)
    scene.approval = ApprovalFactory(tool_call=scene.refund, run=scene.run)
    return scene


@pytest.fixture
def unknown_with_history(customer, clerk_version):
    return refund_scene_with_history(owner=customer, version=clerk_version, wait_reason=WaitReason.RECONCILIATION,
                                     refund_status=ToolCallStatus.UNKNOWN)


def _decision_pages(scene, operator, reconciler):
    if scene.approval is not None:
        client = csrf_client(operator)
        return [client.get(reverse(f"admin:approvals_app_approval_{decision}", args=[scene.approval.pk]))
                for decision in ("approve", "reject")]
    return [csrf_client(reconciler).get(reverse("admin:tools_app_unknowntoolcall_resolve", args=[scene.refund.pk]))]


# --- the decision pages -------------------------------------------------------------------------

@pytest.mark.parametrize("scene_name", ["pending_with_history", "unknown_with_history"])
def test_every_decision_page_shows_the_request_the_conversation_the_money_the_limits_and_the_same_key_calls(
        request, scene_name, operator, reconciler):
    scene = request.getfixturevalue(scene_name)
    for page in _decision_pages(scene, operator, reconciler):
        assert page.status_code == 200
        asked = section(page, "customer-request")
        assert "Check order 9527 and refund it if it's eligible" in asked and "alice" in asked
        facts = text_of(page)
        assert "Amount 25.00 USD" in facts and "Reference (order_id) 9527" in facts
        assert f"Business key {REFUND_KEY}" in facts
        conversation = section(page, "conversation")
        assert "Let me look up order 9527." in conversation and "Order 9527 is eligible; refunding it." in conversation
        assert "refund_eligible" in section(page, "read-results")
        limits = section(page, "limit-windows")
        # 24h: 10.00 USD refunded earlier, 35.00 USD with this call, over 30.00 USD; 1h: 2 calls of 5.
        assert "24h" in limits and "10.00 USD" in limits and "35.00 USD" in limits and "30.00 USD" in limits
        assert "over: operator" in limits
        assert "1h" in limits and "2 calls" in limits and "5 calls" in limits
        same_key = section(page, "same-key-calls")
        assert str(scene.same_key.pk)[:8] in same_key and "failed" in same_key
        assert str(scene.earlier.pk)[:8] not in same_key


def test_the_limit_windows_are_the_run_times_count_in_the_calls_currency(pending_with_history):
    windows = tool_call_limit_windows(tool_call=pending_with_history.refund)
    assert [(w.window, w.currency, w.others_total, w.total, w.others_count, w.count, w.crossed) for w in windows] == [
        ("24h", "USD", Decimal("10.00"), Decimal("35.00"), 1, 2, True),
        ("1h", "USD", Decimal("10.00"), Decimal("35.00"), 1, 2, False),
    ]


def test_a_call_without_an_agent_or_a_business_key_says_so(operator, pending_refund):
    page = csrf_client(operator).get(reverse("admin:approvals_app_approval_approve", args=[pending_refund.approval.pk]))
    assert "No limit of the agent's counts this tool." in section(page, "limit-windows")
    assert "This tool has no business key." in section(page, "same-key-calls")
    assert "Check order 9527" in section(page, "customer-request")


def test_the_buttons_are_confirm_and_take_me_back_in_one_row(operator, pending_with_history):
    page = csrf_client(operator).get(reverse("admin:approvals_app_approval_approve", args=[pending_with_history.approval.pk]))
    body = page.content.decode()
    row = body[body.index('class="submit-row desk-confirm-buttons"'):]
    row = row[:row.index("</div>")]
    assert 'id="confirm-decision"' in row and 'id="take-me-back"' in row


# --- the desk's home --------------------------------------------------------------------------

INTERNALS = ("Access attempts", "Queued tasks", "Idempotency records", "Process heartbeats")


def _index(user):
    return csrf_client(user).get(reverse("admin:index"))


def test_the_index_puts_the_operators_work_first_and_internals_under_administration_for_superusers(db):
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    body = _index(root).content.decode()
    administration = body.index('id="desk-administration"')
    operators = body[:administration]
    internals = body[administration:]
    assert operators.index('class="app-approvals_app') < operators.index('class="app-tools_app') < operators.index('class="app-runs_app')
    for model in ("Approvals", "Unknown tool calls", "Runs", "Sessions"):
        assert f">{model}<" in operators, model
    for model in INTERNALS:
        assert f">{model}<" in internals and f">{model}<" not in operators, model
    # An operators' app keeps its work above; only its internal models move down.
    assert ">Idempotency records<" in internals and ">Messages<" in operators


def test_operators_do_not_see_the_internals_at_all(operator):
    response = _index(operator)
    body = response.content.decode()
    assert 'id="desk-administration"' not in body and "Administration" not in text_of(response)
    for model in INTERNALS:
        assert f">{model}<" not in body, model
    assert ">Approvals<" in body
    assert csrf_client(operator).get(reverse("admin:app_list", args=["axes"])).status_code == 404


def test_the_dashboards_link_covers_the_whole_phrase(operator, pending_refund):
    body = _index(operator).content.decode()
    link = re.search(r'<a [^>]*id="overview-pending-approvals">(.*?)</a>', body, re.S)
    assert link and words(link.group(1)) == "1 pending approval"
    link = re.search(r'<a [^>]*id="overview-unknown-calls">(.*?)</a>', body, re.S)
    assert link and words(link.group(1)) == "0 unknown tool calls"


# --- the words --------------------------------------------------------------------------------

QUEUE = reverse("admin:approvals_app_approval_changelist")


@pytest.mark.parametrize("count", [1, 3])
def test_a_bulk_decision_counts_requests_in_plain_english(operator, count):
    selected = [str(ApprovalFactory().pk) for _ in range(count)]
    client = csrf_client(operator)
    confirm = client.post(QUEUE, {"action": "approve_selected", "_selected_action": selected,
                                  "csrfmiddlewaretoken": csrf_token_of(client.get(QUEUE))})
    title = f"Approve {count} request{'s' if count > 1 else ''}?"
    assert title in text_of(confirm) and "request(s)" not in text_of(confirm)
    response = client.post(QUEUE, {"action": "approve_selected", "_selected_action": selected, "confirm": "yes", "note": "",
                                   "csrfmiddlewaretoken": csrf_token_of(confirm)}, follow=True)
    (message,) = [m for m in messages_of(response) if "Approved" in m]
    assert message.startswith(f"{count} request{'s' if count > 1 else ''} — Approved: ")
    assert "request(s)" not in text_of(response)


def test_a_decided_approvals_page_has_one_expiry_line(operator, pending_refund):
    approval = pending_refund.approval
    Approval.objects.filter(pk=approval.pk).update(status=ApprovalStatus.REJECTED, decided_at=timezone.now(), decided_by=operator,
                                                   expires_at=timezone.now() + timedelta(days=2))
    page = text_of(csrf_client(operator).get(reverse("admin:approvals_app_approval_change", args=[approval.pk])))
    assert "Expires: —" not in page and "Expires:—" not in page
    assert len(re.findall(r"Expires( at)?:", page)) == 1, re.findall(r"Expires[^:]{0,4}:.{0,40}", page)
    assert "was due by" in page


def test_a_pending_approvals_page_has_one_expiry_line_with_the_time_left_and_when(operator, pending_refund):
    page = text_of(csrf_client(operator).get(reverse("admin:approvals_app_approval_change", args=[pending_refund.approval.pk])))
    (line,) = re.findall(r"Expires( at)?: (.{0,60})", page)
    assert line[1].startswith("in ") and str(timezone.localtime(pending_refund.approval.expires_at).year) in line[1]


def test_a_budget_over_the_agents_own_cap_names_it_naturally(db):
    admin = UserFactory(username="agent-admin", is_staff=True)
    version = refund_clerk(by=admin, budget_limits={"max_model_calls": 4})
    customer = UserFactory(username="carol")
    session = SessionFactory(owner=customer, agent=version.agent)
    response = Api(ApiKeyFactory(owner=customer).secret).post(
        f"/sessions/{session.pk}/messages", {"content": "refund order 9527", "budgets": {"max_model_calls": 9}})
    assert response.status_code == 403
    message = response.json()["message"]
    assert "budgets.max_model_calls may be at most 4 (the agent Refund clerk v1's budget_limits cap), not 9" in message
    assert "the cap the" not in message and "the cap the" not in response.json()["fields"][0]["message"]
