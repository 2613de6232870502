"""The desk's roles ship as groups (issue 28): a new deployment's administrator puts people in
"Operators" or "Leads" instead of picking permissions by names the admin does not show. Through the
API: an operator of the group decides a refund and sees every run, but may not freeze money; a lead
may."""

import importlib

import pytest
from django.apps import apps
from django.contrib.auth.models import Group

from tests.support.api import Api
from tests.support.factories import ApiKeyFactory, ApprovalFactory, RunFactory, SessionFactory, UserFactory

SHIPPED = importlib.import_module("operations.migrations.0003_desk_groups")


@pytest.fixture
def groups(db):
    # Made by the migration; a transactional test earlier in the suite empties every table, so a
    # flushed database gets them again the way the migration makes them.
    if not Group.objects.filter(name__in=SHIPPED.ROLES).count() == len(SHIPPED.ROLES):
        SHIPPED.groups_create(apps, None)
    return {group.name: group for group in Group.objects.filter(name__in=SHIPPED.ROLES)}


def _member_of(group, username):
    user = UserFactory(username=username, is_staff=True)
    user.groups.add(group)
    return user, Api(ApiKeyFactory(owner=user).secret)


def test_the_groups_hold_what_their_roles_need(groups):
    held = {name: {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.select_related("content_type")}
            for name, group in groups.items()}
    assert held["Operators"] == set(SHIPPED.OPERATORS)
    assert held["Leads"] == set(SHIPPED.LEADS) > held["Operators"]
    assert "approvals_app.freeze_money" not in held["Operators"]


def test_an_operator_of_the_group_decides_and_a_lead_freezes(groups):
    customer = UserFactory(username="cora")
    approval = ApprovalFactory(run=RunFactory(session=SessionFactory(owner=customer), status="waiting", phase="",
                                              wait_reason="approval"))
    operator, operator_api = _member_of(groups["Operators"], "opal")
    lead, lead_api = _member_of(groups["Leads"], "leda")

    listed = operator_api.get("/runs").json()["items"]
    assert str(approval.run_id) in [run["id"] for run in listed]
    decided = operator_api.post(f"/approvals/{approval.pk}/decision", {"decision": "reject", "note": "not ours"})
    assert decided.status_code == 200, decided.content

    freeze = {"scope": "customer", "target": "cora", "reason": "chargeback under review"}
    assert operator_api.post("/freezes", freeze).status_code == 403
    frozen = lead_api.post("/freezes", freeze)
    assert frozen.status_code == 201, frozen.content
