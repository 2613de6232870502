"""Out-of-office delegation (issue 31, point 3): a delegate's decision records both names — on the
decision, the audit entry and the ledger — through the link, the desk and the API; delegation never
lets anyone decide their own session's write nor count twice in a quorum; an ended or revoked
delegation gives no power; and what delegation_set refuses."""

import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from approvals_app.errors import ApprovalRefusal
from approvals_app.models import Approval, ApprovalDecision, ApprovalStatus, AuditEntry, Delegation, LedgerEntry
from config.errors import WardenError
from engine.actions.approvals import approval_decide
from engine.actions.delegations import delegation_revoke, delegation_set
from tests.support.api import Api
from tests.support.desk import csrf_token_of
from tests.support.factories import ApiKeyFactory, UserFactory
from tests.support.links import link_decide, link_for, link_path, operator_named, refund_waiting, signed_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(db):
    return UserFactory(username="alice")


@pytest.fixture
def ann(db):
    """The decider who is away."""
    return operator_named("op-ann")


@pytest.fixture
def bob(db):
    """Her stand-in: staff who may not decide in his own right."""
    return operator_named("op-bob", decides=False)


@pytest.fixture
def ann_away(ann, bob) -> Delegation:
    return delegation_set(delegator=ann, delegate=bob, starts_at=None, ends_at=timezone.now() + timedelta(days=7),
                          reason="on leave", acting_user=ann)


def decided_in_both_names(approval: Approval, *, by, for_) -> None:
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and approval.decided_by == by
    decision = ApprovalDecision.objects.get(approval=approval)
    assert (decision.decided_by, decision.on_behalf_of) == (by, for_)
    entry = AuditEntry.objects.get(object_id=str(approval.pk), action="approve")
    assert entry.actor == by and entry.after["on_behalf_of"] == for_.get_username()
    ledger = LedgerEntry.objects.get(subject=f"approval:{approval.pk}")
    payload = json.loads(ledger.payload)
    assert (ledger.actor, payload["on_behalf_of"], payload["on_behalf_of_id"]) == (by.get_username(), for_.get_username(), for_.pk)


# --- both names --------------------------------------------------------------------------------------

def test_a_stand_ins_approval_through_the_link_records_both_names(alice, ann, bob, ann_away):
    approval = refund_waiting(owner=alice)
    link = link_for(approval, bob, on_behalf_of=ann)
    client = signed_in(bob)
    page = client.get(link_path(link))
    assert "You decide as op-bob, standing in for op-ann." in page.content.decode()
    response = link_decide(client, link)
    assert response.status_code == 200, response.content.decode()
    decided_in_both_names(approval, by=bob, for_=ann)


def test_a_stand_ins_approval_on_the_desk_records_both_names(alice, ann, bob, ann_away):
    approval = refund_waiting(owner=alice)
    url = reverse("admin:approvals_app_approval_approve", args=[approval.pk])
    client = signed_in(bob)
    page = client.get(url)
    assert page.status_code == 200
    assert "You decide for op-ann (standing in)." in page.content.decode()
    response = client.post(url, {"note": "for ann", "csrfmiddlewaretoken": csrf_token_of(page)})
    assert response.status_code == 302
    decided_in_both_names(approval, by=bob, for_=ann)


def test_a_stand_ins_approval_over_the_api_records_both_names(alice, ann, bob, ann_away):
    approval = refund_waiting(owner=alice)
    response = Api(ApiKeyFactory(owner=bob).secret).post(f"/approvals/{approval.pk}/decision", {"decision": "approve"})
    assert response.status_code == 200, response.content
    decided_in_both_names(approval, by=bob, for_=ann)


# --- never one's own session ---------------------------------------------------------------------------

def test_a_stand_in_may_not_approve_a_request_from_their_own_session(ann, bob, ann_away):
    approval = refund_waiting(owner=bob)
    with pytest.raises(WardenError) as refused:
        approval_decide(approval=approval, decision="approve", acting_user=bob, on_behalf_of=ann)
    assert refused.value.code is ApprovalRefusal.NOT_PERMITTED and "your own session" in refused.value.message
    with pytest.raises(WardenError):
        approval_decide(approval=approval, decision="approve", acting_user=bob)  # nor implicitly
    response = link_decide(signed_in(bob), link_for(approval, bob, on_behalf_of=ann))
    assert response.status_code == 403 and "your own session" in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING and not ApprovalDecision.objects.filter(approval=approval).exists()


def test_a_stand_in_may_not_approve_the_delegators_own_session(ann, bob, ann_away):
    approval = refund_waiting(owner=ann)
    with pytest.raises(WardenError) as refused:
        approval_decide(approval=approval, decision="approve", acting_user=bob, on_behalf_of=ann)
    assert refused.value.code is ApprovalRefusal.NOT_PERMITTED
    assert "op-ann may not decide it, so neither may their stand-in" in refused.value.message
    response = Api(ApiKeyFactory(owner=bob).secret).post(f"/approvals/{approval.pk}/decision", {"decision": "approve"})
    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING


# --- a person counts once in a quorum --------------------------------------------------------------------

def test_in_a_quorum_a_person_counts_once_whoever_decided_for_them(alice, ann):
    bob = operator_named("op-bob")  # may decide in his own right too
    carol = operator_named("op-carol")
    delegation_set(delegator=ann, delegate=bob, starts_at=None, ends_at=timezone.now() + timedelta(days=1), reason="",
                   acting_user=ann)
    approval = refund_waiting(owner=alice, required_approvals=2)
    approval_decide(approval=approval, decision="approve", acting_user=bob, on_behalf_of=ann)
    with pytest.raises(WardenError) as ann_again:
        approval_decide(approval=approval, decision="approve", acting_user=ann)
    assert ann_again.value.code is ApprovalRefusal.ALREADY_DECIDED
    with pytest.raises(WardenError) as bob_himself:
        approval_decide(approval=approval, decision="approve", acting_user=bob)
    assert bob_himself.value.code is ApprovalRefusal.ALREADY_DECIDED
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING and ApprovalDecision.objects.filter(approval=approval).count() == 1
    approval_decide(approval=approval, decision="approve", acting_user=carol)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert {(d.decided_by.username, d.on_behalf_of.username if d.on_behalf_of else None)
            for d in ApprovalDecision.objects.filter(approval=approval)} == {("op-bob", "op-ann"), ("op-carol", None)}


# --- an ended or revoked delegation gives nothing ------------------------------------------------------------

def test_a_revoked_delegation_gives_no_power(alice, ann, bob, ann_away):
    approval = refund_waiting(owner=alice)
    delegation_revoke(delegation=ann_away, acting_user=ann)
    with pytest.raises(WardenError) as refused:
        approval_decide(approval=approval, decision="approve", acting_user=bob)
    assert refused.value.code is ApprovalRefusal.NOT_PERMITTED
    page = signed_in(bob).get(reverse("admin:approvals_app_approval_approve", args=[approval.pk]))
    assert page.status_code == 403 and "standing in" not in page.content.decode()
    response = link_decide(signed_in(bob), link_for(approval, bob, on_behalf_of=ann))
    assert response.status_code == 403 and "You do not stand in for op-ann now" in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING


def test_an_ended_delegation_gives_no_power(alice, ann, bob, ann_away):
    approval = refund_waiting(owner=alice)
    Delegation.objects.filter(pk=ann_away.pk).update(starts_at=timezone.now() - timedelta(days=2),
                                                     ends_at=timezone.now() - timedelta(days=1))
    with pytest.raises(WardenError):
        approval_decide(approval=approval, decision="approve", acting_user=bob, on_behalf_of=ann)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING


def test_a_delegation_not_yet_begun_gives_no_power(alice, ann, bob):
    delegation_set(delegator=ann, delegate=bob, starts_at=timezone.now() + timedelta(days=1),
                   ends_at=timezone.now() + timedelta(days=3), reason="next week", acting_user=ann)
    approval = refund_waiting(owner=alice)
    with pytest.raises(WardenError):
        approval_decide(approval=approval, decision="approve", acting_user=bob)


# --- setting and revoking ------------------------------------------------------------------------------------

def test_setting_and_revoking_are_audited_and_on_the_ledger(ann, bob, ann_away):
    entry = AuditEntry.objects.get(object_type="delegation", object_id=str(ann_away.pk), action="delegate")
    assert entry.actor == ann and entry.after["delegate"] == "op-bob" and entry.note == "on leave"
    delegation_revoke(delegation=ann_away, acting_user=ann)
    assert AuditEntry.objects.filter(object_id=str(ann_away.pk), action="revoke_delegation").count() == 1
    kinds = list(LedgerEntry.objects.filter(subject=f"delegation:{ann_away.pk}").values_list("kind", flat=True))
    assert kinds == ["delegation_set", "delegation_revoke"]
    with pytest.raises(WardenError) as again:
        delegation_revoke(delegation=ann_away, acting_user=ann)
    assert again.value.code is ApprovalRefusal.DELEGATION_ENDED


def _refused(code, **changes):
    with pytest.raises(WardenError) as refused:
        delegation_set(**changes)
    assert refused.value.code is code, refused.value.message
    return refused.value.message


def test_what_delegation_set_refuses(ann, bob):
    in_a_week = timezone.now() + timedelta(days=7)
    base = {"delegator": ann, "delegate": bob, "starts_at": None, "ends_at": in_a_week, "reason": "", "acting_user": ann}
    assert "oneself" in _refused(ApprovalRefusal.INVALID_DELEGATION, **base | {"delegate": ann})
    gone = UserFactory(username="gone", is_active=False)
    assert "inactive" in _refused(ApprovalRefusal.INVALID_DELEGATION, **base | {"delegate": gone})
    assert "after the start" in _refused(ApprovalRefusal.INVALID_DELEGATION, **base | {
        "starts_at": in_a_week, "ends_at": in_a_week - timedelta(days=1)})
    assert "at most 90 days" in _refused(ApprovalRefusal.INVALID_DELEGATION, **base | {
        "ends_at": timezone.now() + timedelta(days=91)})
    carol = operator_named("op-carol")
    assert "Only op-ann or a superuser" in _refused(ApprovalRefusal.NOT_PERMITTED, **base | {"acting_user": carol})
    assert "decide operator approvals" in _refused(ApprovalRefusal.NOT_PERMITTED, **base | {
        "delegator": bob, "delegate": ann, "acting_user": bob})
    delegation_set(**base)
    overlapping = base | {"delegate": carol, "starts_at": timezone.now() + timedelta(days=3),
                          "ends_at": timezone.now() + timedelta(days=10)}
    assert "op-bob standing in" in _refused(ApprovalRefusal.DELEGATION_OVERLAPS, **overlapping)
    assert Delegation.objects.filter(delegator=ann).count() == 1


def test_a_superuser_sets_a_delegation_for_anyone(ann, bob):
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    delegation = delegation_set(delegator=ann, delegate=bob, starts_at=None, ends_at=timezone.now() + timedelta(days=2),
                                reason="ann is ill", acting_user=root)
    assert (delegation.delegator, delegation.delegate, delegation.created_by) == (ann, bob, root)


# --- the desk and the API ---------------------------------------------------------------------------------------

def test_on_the_desk_an_operator_sets_their_own_delegation_through_the_action(ann, bob):
    client = signed_in(ann)
    add = reverse("admin:approvals_app_delegation_add")
    page = client.get(add)
    assert page.status_code == 200
    ends = timezone.localtime(timezone.now() + timedelta(days=5))
    response = client.post(add, {"delegate": bob.pk, "ends_at_0": ends.strftime("%Y-%m-%d"), "ends_at_1": ends.strftime("%H:%M:%S"),
                                 "reason": "holiday", "csrfmiddlewaretoken": csrf_token_of(page)})
    assert response.status_code == 302, response.content.decode()[:3000]
    delegation = Delegation.objects.get(delegator=ann)
    assert delegation.delegate == bob and delegation.created_by == ann
    assert LedgerEntry.objects.filter(subject=f"delegation:{delegation.pk}", kind="delegation_set").exists()
    listing = client.get(reverse("admin:approvals_app_delegation_changelist"))
    assert "op-bob" in listing.content.decode() and "in force" in listing.content.decode()
    revoke = client.post(reverse("admin:approvals_app_delegation_changelist"), {
        "action": "revoke_selected", "_selected_action": [delegation.pk],
        "csrfmiddlewaretoken": csrf_token_of(listing)})
    assert revoke.status_code == 302
    delegation.refresh_from_db()
    assert delegation.revoked_at is not None


def test_over_the_api_the_caller_sets_lists_and_revokes_their_delegations(ann, bob):
    api = Api(ApiKeyFactory(owner=ann).secret)
    ends = (timezone.now() + timedelta(days=5)).isoformat()
    created = api.post("/me/delegations", {"delegate": "op-bob", "ends_at": ends, "reason": "holiday"})
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["delegator"], body["delegate"], body["in_force"]) == ("op-ann", "op-bob", True)
    assert [d["id"] for d in api.get("/me/delegations").json()] == [body["id"]]
    assert [d["id"] for d in Api(ApiKeyFactory(owner=bob).secret).get("/me/delegations").json()] == [body["id"]]
    overlap = api.post("/me/delegations", {"delegate": "op-bob", "ends_at": ends})
    assert overlap.status_code == 409 and overlap.json()["code"] == "delegation_overlaps"
    unknown = api.post("/me/delegations", {"delegate": "nobody", "ends_at": ends})
    assert unknown.status_code == 409 and unknown.json()["fields"][0]["field"] == "body.delegate"
    stranger = Api(ApiKeyFactory(owner=operator_named("op-carol")).secret)
    assert stranger.post(f"/me/delegations/{body['id']}/revoke").status_code == 404
    someone_elses = api.post("/me/delegations", {"delegate": "op-bob", "ends_at": ends, "delegator": "op-carol"})
    assert someone_elses.status_code == 403 and "Only a superuser" in someone_elses.json()["message"]
    revoked = api.post(f"/me/delegations/{body['id']}/revoke")
    assert revoked.status_code == 200 and revoked.json()["in_force"] is False
    assert api.post(f"/me/delegations/{body['id']}/revoke").status_code == 409
    no_power = Api(ApiKeyFactory(owner=bob).secret).post("/me/delegations", {"delegate": "op-ann", "ends_at": ends})
    assert no_power.status_code == 403
