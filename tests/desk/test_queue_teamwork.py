"""The approval queue worked by a team on shift (issue 29): assigning requests (to oneself, to a
colleague, to nobody) only among people who may decide them, audited; the mine and unassigned
views; saved views that are one's own; CSV export of a desk list with its filters, as the policy
lets one see it, audited and safe to open in a spreadsheet; and the dashboard's counts by tier and
by wait, each a link to exactly the rows it counts."""

import csv
import io
import re
from datetime import timedelta
from html import unescape

import pytest
from django.urls import reverse
from django.utils import timezone

from approvals_app.errors import ApprovalRefusal
from approvals_app.models import Approval, ApprovalPolicy, ApprovalStatus, AuditEntry, SavedView
from config.errors import WardenError
from desk.export import csv_safe
from engine.actions.approvals import approval_assign
from runs_app.models import Run, RunStatus
from tests.support.desk import csrf_client, csrf_token_of, messages_of, staff_user
from tests.support.factories import ApprovalFactory, SavedViewFactory, SessionFactory, UserFactory

pytestmark = pytest.mark.django_db

QUEUE = reverse("admin:approvals_app_approval_changelist")
QUEUE_CSV = reverse("admin:approvals_app_approval_export_csv")


@pytest.fixture
def colleague(db):
    """A second operator on the shift, with the same powers as `operator`."""
    return staff_user("op2", "decide_approval")


def queue_ids(client, **params) -> list:
    return [approval.pk for approval in client.get(QUEUE, params).context["cl"].result_list]


def run_action(client, action: str, approvals, **extra):
    token = csrf_token_of(client.get(QUEUE))
    return client.post(QUEUE, {"action": action, "_selected_action": [str(a.pk) for a in approvals],
                               "csrfmiddlewaretoken": token, **extra}, follow=True)


def csv_rows(response) -> list[list[str]]:
    assert response.status_code == 200, response.status_code
    assert response["Content-Type"].startswith("text/csv") and response.streaming
    return list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))


# --- assignment ---------------------------------------------------------------------------------

def test_an_operator_assigns_three_requests_to_themselves_and_mine_lists_exactly_those(operator, colleague):
    three, other = [ApprovalFactory() for _ in range(3)], ApprovalFactory()
    client = csrf_client(operator)
    response = run_action(client, "assign_to_me", three)
    assert "3 requests assigned to you." in messages_of(response), messages_of(response)
    assert {a.assigned_to_id for a in Approval.objects.filter(pk__in=[a.pk for a in three])} == {operator.pk}
    assert sorted(queue_ids(client, assigned="mine")) == sorted(a.pk for a in three)
    assert queue_ids(client, assigned="none") == [other.pk]
    entries = AuditEntry.objects.filter(action="assign", actor=operator)
    assert sorted(e.object_id for e in entries) == sorted(str(a.pk) for a in three)
    assert {(e.before["assigned_to"], e.after["assigned_to"]) for e in entries} == {(None, "op")}

    # The second operator sees them as the first one's, and none of them as theirs.
    page = csrf_client(colleague).get(QUEUE)
    assert queue_ids(csrf_client(colleague), assigned="mine") == []
    assigned_cells = re.findall(r'<td class="field-assigned">([^<]*)</td>', page.content.decode())
    assert sorted(assigned_cells) == ["op", "op", "op", "—"]
    assert sorted(queue_ids(csrf_client(colleague), assigned="others")) == sorted(a.pk for a in three)


def test_assign_to_asks_whom_among_the_deciders_then_assigns_and_audits(operator, colleague, viewer):
    approval = ApprovalFactory()
    client = csrf_client(operator)
    page = run_action(client, "assign_to", [approval])
    text = page.content.decode()
    assert 'id="assign-form"' in text and ">op2</option>" in text and ">op (you)</option>" in text
    assert ">viewer</option>" not in text  # may not decide: never offered
    response = client.post(QUEUE, {"action": "assign_to", "_selected_action": [str(approval.pk)], "confirm": "yes",
                                   "assignee": str(colleague.pk), "csrfmiddlewaretoken": csrf_token_of(page)}, follow=True)
    assert "1 request assigned to op2." in messages_of(response)
    approval.refresh_from_db()
    assert approval.assigned_to == colleague and approval.assigned_at is not None
    assert AuditEntry.objects.get(action="assign", object_id=str(approval.pk)).after == {"assigned_to": "op2"}


def test_unassign_puts_a_request_back_in_nobodys_hands(operator):
    approval = ApprovalFactory()
    approval_assign(approvals=[approval], assignee=operator, acting_user=operator)
    response = run_action(csrf_client(operator), "unassign", [approval])
    assert "1 request now unassigned." in messages_of(response)
    approval.refresh_from_db()
    assert approval.assigned_to is None and approval.assigned_at is None
    assert AuditEntry.objects.get(action="unassign").before == {"assigned_to": "op"}


def test_without_the_decide_permission_nobody_assigns_anything(viewer, operator):
    approval = ApprovalFactory()
    with pytest.raises(WardenError) as refused:
        approval_assign(approvals=[approval], assignee=viewer, acting_user=viewer)
    assert refused.value.code is ApprovalRefusal.NOT_PERMITTED and "decide_approval" in refused.value.message
    client = csrf_client(viewer)
    assert "assign_to_me" not in client.get(QUEUE).content.decode()
    run_action(client, "assign_to_me", [approval])
    approval.refresh_from_db()
    assert approval.assigned_to is None and not AuditEntry.objects.filter(action="assign").exists()


def test_a_request_goes_only_to_someone_who_may_decide_it_and_all_or_nothing(operator, colleague, viewer):
    fine = ApprovalFactory()
    own = ApprovalFactory(tool_call__step__run__session=SessionFactory(owner=colleague))  # four eyes bars op2
    with pytest.raises(WardenError) as refused:
        approval_assign(approvals=[fine, own], assignee=colleague, acting_user=operator)
    assert refused.value.code is ApprovalRefusal.NOT_PERMITTED
    assert "Not assigned to op2" in refused.value.message and "Four eyes" in refused.value.message
    with pytest.raises(WardenError, match="decide_approval"):
        approval_assign(approvals=[fine], assignee=viewer, acting_user=operator)
    # A customer's confirmation is the customer's alone.
    confirmation = ApprovalFactory(policy=ApprovalPolicy.USER)
    with pytest.raises(WardenError, match="Only the customer"):
        approval_assign(approvals=[confirmation], assignee=operator, acting_user=operator)
    assert not Approval.objects.filter(assigned_to__isnull=False).exists()
    assert not AuditEntry.objects.filter(action="assign").exists()
    # The operator may still give op2's own-session request to someone else: assigning is not deciding it.
    assert approval_assign(approvals=[own], assignee=operator, acting_user=colleague) == [own]


def test_a_decided_request_keeps_who_worked_it(operator):
    approval = ApprovalFactory()
    approval_assign(approvals=[approval], assignee=operator, acting_user=operator)
    Approval.objects.filter(pk=approval.pk).update(status=ApprovalStatus.EXPIRED, decided_at=timezone.now())
    with pytest.raises(WardenError) as refused:
        approval_assign(approvals=[approval], assignee=None, acting_user=operator)
    assert refused.value.code is ApprovalRefusal.ALREADY_DECIDED
    approval.refresh_from_db()
    assert approval.assigned_to == operator


# --- saved views ---------------------------------------------------------------------------------

def test_an_operator_saves_a_view_sees_only_their_own_and_deletes_it(operator, colleague):
    theirs = SavedViewFactory(owner=colleague, name="op2's refunds")
    client = csrf_client(operator)
    url = f"{QUEUE}?assigned=mine&status__exact=all"
    page = client.get(url)
    response = client.post(reverse("admin:approvals_app_approval_view_save"),
                           {"name": "  my   shift ", "url": url, "csrfmiddlewaretoken": csrf_token_of(page)}, follow=True)
    assert "Saved as your view “my shift”." in messages_of(response)
    saved = SavedView.objects.get(owner=operator)
    assert (saved.name, saved.url) == ("my shift", url)
    text = client.get(QUEUE).content.decode()
    assert 'data-saved-view="my shift"' in text and "op2&#x27;s refunds" not in text and "op2's refunds" not in text
    listed = client.get(reverse("admin:approvals_app_savedview_changelist")).context["cl"].result_list
    assert list(listed) == [saved]

    token = csrf_token_of(client.get(QUEUE))
    assert client.post(reverse("admin:approvals_app_approval_view_delete", args=[theirs.pk]),
                       {"csrfmiddlewaretoken": token}).status_code == 404
    assert SavedView.objects.filter(pk=theirs.pk).exists()
    client.post(reverse("admin:approvals_app_approval_view_delete", args=[saved.pk]), {"csrfmiddlewaretoken": token, "next": QUEUE})
    assert not SavedView.objects.filter(owner=operator).exists()


def test_only_a_list_of_the_desk_is_saved_as_a_view(operator):
    client = csrf_client(operator)
    token = csrf_token_of(client.get(QUEUE))
    for url in ["https://evil.example/admin/approvals_app/approval/", "//evil.example/", "/console/", "/admin/"]:
        response = client.post(reverse("admin:approvals_app_approval_view_save"), {"name": "x", "url": url,
                                                                               "csrfmiddlewaretoken": token}, follow=True)
        assert "Only a list of the desk can be saved as a view." in messages_of(response), url
    assert not SavedView.objects.exists()


# --- CSV export ----------------------------------------------------------------------------------

def test_the_queue_exports_every_row_its_filters_select_in_its_columns_audited(operator):
    mine = [ApprovalFactory() for _ in range(3)]
    ApprovalFactory()  # unassigned: not in the view
    approval_assign(approvals=mine, assignee=operator, acting_user=operator)
    client = csrf_client(operator)
    page = client.get(QUEUE, {"assigned": "mine", "status__exact": "all"})
    export_url = unescape(re.search(r'id="export-csv" href="([^"]+)"', page.content.decode()).group(1))
    assert export_url.startswith(QUEUE_CSV + "?") and "assigned=mine" in export_url

    with_page_size_one = client.get(export_url + "&p=1")  # every row, not one page's
    rows = csv_rows(with_page_size_one)
    assert rows[0] == ["amount", "request", "customer", "waiting", "expires", "rule", "status", "assigned", "escalation"]
    shown = page.context["cl"].result_list
    assert len(rows) - 1 == len(shown) == 3
    assert [row[2] for row in rows[1:]] == [a.run.session.owner.get_username() for a in shown]
    assert {row[7] for row in rows[1:]} == {"op"}  # a name, never "you"
    assert rows[1][1].endswith(" · execute_refund") and "<" not in rows[1][1]  # the cell's words, not its HTML
    entry = AuditEntry.objects.get(action="export")
    assert entry.actor == operator and entry.object_type == "approval list"
    assert entry.after["rows"] == 3 and entry.after["filters"]["assigned"] == "mine"


def test_an_export_holds_only_what_the_policy_lets_the_operator_see(db):
    decider = staff_user("decider-only")  # view_* of every model, but no view_run: …
    from django.contrib.auth.models import Permission

    decider.user_permissions.remove(*Permission.objects.filter(codename="view_run"))
    decider.user_permissions.add(*Permission.objects.filter(codename="decide_approval"))
    operator_level = ApprovalFactory()
    ApprovalFactory(policy=ApprovalPolicy.USER)  # … so another customer's confirmation is not theirs to see
    rows = csv_rows(csrf_client(decider).get(QUEUE_CSV))
    assert len(rows) == 2 and rows[1][2] == operator_level.run.session.owner.get_username()
    assert AuditEntry.objects.get(action="export").after["rows"] == 1


def test_a_cell_that_would_be_a_formula_is_quoted(operator):
    for name in ["=HYPERLINK(\"http://x\")", "+1", "-2", "@SUM(A1)"]:
        ApprovalFactory(tool_call__step__run__session=SessionFactory(owner=UserFactory(username=name)))
    rows = csv_rows(csrf_client(operator).get(QUEUE_CSV))
    assert sorted(row[2] for row in rows[1:]) == sorted(["'=HYPERLINK(\"http://x\")", "'+1", "'-2", "'@SUM(A1)"])
    assert csv_safe("\tcmd") == "'\tcmd" and csv_safe("9527") == "9527"


def test_the_runs_list_exports_with_its_filters_and_a_viewer_of_nothing_gets_nothing(operator, customer):
    ApprovalFactory(), ApprovalFactory()
    client = csrf_client(operator)
    rows = csv_rows(client.get(reverse("admin:runs_app_run_export_csv"), {"status__exact": RunStatus.QUEUED}))
    assert len(rows) - 1 == Run.objects.filter(status=RunStatus.QUEUED).count() == 2
    assert rows[0][0]  # the list's column titles
    customer.is_staff = True
    customer.save()
    assert csv_rows(csrf_client(customer).get(reverse("admin:runs_app_run_export_csv"))) [1:] == []  # their own runs: none
    assert csrf_client(operator).get(reverse("admin:approvals_app_ledgerentry_export_csv")).status_code == 403


# --- the dashboard's counts ------------------------------------------------------------------------

def test_every_number_of_the_dashboards_counts_links_to_a_list_of_exactly_that_many(operator):
    now = timezone.now()
    ages = [timedelta(minutes=2), timedelta(minutes=3), timedelta(minutes=30), timedelta(hours=2)]
    made = [ApprovalFactory(), ApprovalFactory(), ApprovalFactory(required_approvals=2), ApprovalFactory(policy=ApprovalPolicy.USER)]
    for approval, waited in zip(made, ages):
        Approval.objects.filter(pk=approval.pk).update(requested_at=now - waited)
    approval_assign(approvals=made[:1], assignee=operator, acting_user=operator)
    client = csrf_client(operator)
    page = client.get(reverse("admin:index")).content.decode()
    panel = page[page.index('id="pending-counts"'):]
    links = re.findall(r'<td><a href="([^"]+)" data-(tier|waited|assigned)="([^"]+)">(\d+)</a></td>', panel)
    counts = {(kind, key): int(number) for _, kind, key, number in links}
    assert counts == {("tier", "user"): 1, ("tier", "operator"): 2, ("tier", "quorum"): 1,
                      ("waited", "lt10m"): 2, ("waited", "10m-1h"): 1, ("waited", "gt1h"): 1,
                      ("assigned", "mine"): 1, ("assigned", "none"): 3}
    for url, kind, key, number in links:
        listed = client.get(unescape(url)).context["cl"]
        assert listed.result_count == int(number), (kind, key)
