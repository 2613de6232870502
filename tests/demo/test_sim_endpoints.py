"""The simulated service's HTTP contract, through Django's test client on the simulator's own
URLconf — the one its server uses (demo/asgi.py); the main application has no /sim."""

import json
from decimal import Decimal

import pytest
from django.middleware.csrf import _get_new_csrf_string
from django.test import Client

from tests.support.factories import SimFaultFactory, SimOrderFactory, SimRefundFactory, SimUserLevelFactory
from tests.support.factories import UserFactory
from demo.models import SimFault, SimFaultMode, SimFaultTarget
from demo.selectors import sim_refund_count

pytestmark = [pytest.mark.django_db, pytest.mark.urls("demo.urls")]


def post_refund(client, body, key="key-1"):
    headers = {"Idempotency-Key": key} if key else {}
    return client.post("/sim/refunds", json.dumps(body), content_type="application/json", headers=headers)


def test_order_detail_reports_eligibility_and_refund_state(client):
    order = SimOrderFactory(order_id="9527", user_id="u1", amount=Decimal("25.00"))
    assert client.get("/sim/orders/9527").json() == {
        "order_id": "9527", "user_id": "u1", "amount": "25.00", "currency": "USD", "status": "delivered",
        "refund_eligible": True, "ineligible_reason": "", "refunded": False,
    }
    SimRefundFactory(order=order)
    assert client.get("/sim/orders/9527").json()["refunded"] is True


def test_unknown_order_and_user_are_404_with_a_code(client):
    order = client.get("/sim/orders/0000")
    user = client.get("/sim/users/nobody/level")
    assert (order.status_code, order.json()["error"]["code"]) == (404, "order_not_found")
    assert (user.status_code, user.json()["error"]["code"]) == (404, "user_not_found")


def test_user_level(client):
    SimUserLevelFactory(user_id="u1", level="gold")
    assert client.get("/sim/users/u1/level").json() == {"user_id": "u1", "level": "gold"}


def test_weather_is_deterministic_per_city(client):
    paris = client.get("/sim/weather", {"city": "Paris"}).json()
    assert client.get("/sim/weather", {"city": "paris "}).json()["summary"] == paris["summary"]
    assert set(paris) == {"city", "summary", "temperature_c"}
    assert client.get("/sim/weather").status_code == 400


def test_refund_is_booked_then_replayed_for_the_same_key(client):
    SimOrderFactory(order_id="9527")
    first = post_refund(client, {"order_id": "9527", "amount": "25.00", "reason": "broken"})
    again = post_refund(client, {"order_id": "9527", "amount": "25", "reason": "broken"})
    assert first.status_code == 201
    assert first.json()["status"] == "booked" and first.json()["replayed"] is False
    assert first.json()["idempotency_key"] == "key-1" and first.json()["amount"] == "25.00"
    assert again.status_code == 200 and again.json()["replayed"] is True
    assert again.json()["refund_id"] == first.json()["refund_id"]
    assert client.get("/sim/refunds/count", {"order_id": "9527"}).json()["count"] == 1


def test_refund_needs_an_idempotency_key(client):
    SimOrderFactory(order_id="9527")
    response = post_refund(client, {"order_id": "9527", "amount": "25.00"}, key=None)
    assert (response.status_code, response.json()["error"]["code"]) == (400, "idempotency_key_required")
    assert sim_refund_count() == 0


def test_reused_key_with_another_amount_is_422(client):
    SimOrderFactory(order_id="9527")
    post_refund(client, {"order_id": "9527", "amount": "25.00"})
    response = post_refund(client, {"order_id": "9527", "amount": "10.00"})
    assert (response.status_code, response.json()["error"]["code"]) == (422, "idempotency_key_reused")
    assert sim_refund_count() == 1


def test_ineligible_and_already_refunded_orders_are_409_and_book_nothing(client):
    SimOrderFactory(order_id="9528", refund_eligible=False, ineligible_reason="delivered more than 30 days ago")
    SimRefundFactory(order=SimOrderFactory(order_id="9527"), idempotency_key="earlier")
    ineligible = post_refund(client, {"order_id": "9528", "amount": "25.00"}, key="a")
    refunded = post_refund(client, {"order_id": "9527", "amount": "25.00"}, key="b")
    assert (ineligible.status_code, ineligible.json()["error"]["code"]) == (409, "not_eligible")
    assert (refunded.status_code, refunded.json()["error"]["code"]) == (409, "already_refunded")
    assert sim_refund_count(order_id="9528") == 0 and sim_refund_count(order_id="9527") == 1


def test_unknown_order_refund_is_404(client):
    response = post_refund(client, {"order_id": "0000", "amount": "1.00"})
    assert (response.status_code, response.json()["error"]["code"]) == (404, "order_not_found")


@pytest.mark.parametrize("amount", ["0", "-5", "1.234", "abc", None, True, "NaN", "1e30", "1000000000.01"])
def test_bad_amounts_are_400(client, amount):
    SimOrderFactory(order_id="9527")
    response = post_refund(client, {"order_id": "9527", "amount": amount})
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_amount")


def test_text_with_nul_is_400_not_a_database_error(client):
    SimOrderFactory(order_id="9527")
    refused = [
        client.get("/sim/orders/95%0027"),
        client.get("/sim/refunds", {"idempotency_key": "k\x00"}),
        client.get("/sim/refunds/count", {"order_id": "\x00"}),
        post_refund(client, {"order_id": "9527\x00", "amount": "1.00"}),
        post_refund(client, {"order_id": "9527", "amount": "1.00", "reason": "\x00"}),
    ]
    assert [(r.status_code, r.json()["error"]["code"]) for r in refused] == [(400, "invalid_request")] * 5
    assert sim_refund_count(order_id="9527") == 0


def test_malformed_body_is_400(client):
    response = client.post("/sim/refunds", "{nope", content_type="application/json", headers={"Idempotency-Key": "k"})
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_json")


def test_refund_lookup_by_key(client):
    refund = SimRefundFactory(idempotency_key="known")
    found = client.get("/sim/refunds", {"idempotency_key": "known"})
    missing = client.get("/sim/refunds", {"idempotency_key": "unknown"})
    assert found.status_code == 200 and found.json()["refund_id"] == refund.refund_id
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "refund_not_found")
    assert client.get("/sim/refunds").status_code == 400


def test_error_before_booking_fault_answers_503_and_books_nothing(client):
    SimOrderFactory(order_id="9527")
    SimFaultFactory(target=SimFaultTarget.REFUND, mode=SimFaultMode.ERROR_BEFORE_BOOKING)
    failed = post_refund(client, {"order_id": "9527", "amount": "25.00"})
    assert failed.status_code == 503
    assert failed.json()["error"] == {"code": "gateway_unavailable", "detail": "injected fault", "booked": False}
    assert sim_refund_count() == 0
    # The fault was armed for one request: the retry goes through.
    assert post_refund(client, {"order_id": "9527", "amount": "25.00"}).status_code == 201


def test_read_endpoint_fault_answers_503(client):
    SimOrderFactory(order_id="9527")
    SimFaultFactory(target=SimFaultTarget.ORDER, mode=SimFaultMode.ERROR_BEFORE_BOOKING, remaining=-1)
    assert client.get("/sim/orders/9527").status_code == 503
    assert client.get("/sim/orders/9527").status_code == 503
    assert client.get("/sim/weather", {"city": "Paris"}).status_code == 200


def test_unsupported_method_is_405_json(client):
    response = client.delete("/sim/orders/9527")
    assert (response.status_code, response.json()["error"]["code"]) == (405, "method_not_allowed")


# --- the fault switchboard: staff with the permission, audited ------------------------------------


def _fault_armer():
    from django.contrib.auth.models import Permission
    staffer = UserFactory(username="staffer", is_staff=True)
    staffer.user_permissions.add(Permission.objects.get(content_type__app_label="demo", codename="change_simfault"))
    return staffer


def test_staff_without_the_permission_may_not_arm_faults_and_arming_is_audited(client):
    """Issue 27, finding 12: the switchboard checked is_staff only, and nothing was audited."""
    from approvals_app.models import AuditEntry

    client.force_login(UserFactory(username="plain-staff", is_staff=True))
    refused = client.post("/sim/faults", {"target": "refund", "mode": "delay"}, content_type="application/json")
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "permission_required")
    assert client.get("/sim/webhooks/").status_code in (403, 404)  # the log too (404 outside demo mode)
    assert not SimFault.objects.exists()
    client.force_login(_fault_armer())
    assert client.post("/sim/faults", {"target": "refund", "mode": "delay"}, content_type="application/json").status_code == 200
    assert client.delete("/sim/faults").status_code == 200
    trail = AuditEntry.objects.filter(object_type="simfault").order_by("id")
    assert [(e.action, e.actor.username, e.object_id) for e in trail] == [
        ("demo_fault_arm", "staffer", "refund"), ("demo_fault_clear", "staffer", "all")]


def test_faults_are_forbidden_to_anonymous_and_non_staff(client):
    anonymous = client.get("/sim/faults")
    client.force_login(UserFactory(username="customer", is_staff=False))
    customer_get = client.get("/sim/faults")
    customer_post = client.post("/sim/faults", {"target": "refund", "mode": "delay"}, content_type="application/json")
    for response in (anonymous, customer_get, customer_post):
        assert (response.status_code, response.json()["error"]["code"]) == (403, "staff_required")
    assert not SimFault.objects.exists()


def test_staff_arms_lists_and_clears_faults(client):
    client.force_login(_fault_armer())
    armed = client.post(
        "/sim/faults",
        {"target": "refund", "mode": "timeout_after_booking", "delay_seconds": 1.5, "count": -1},
        content_type="application/json",
    )
    assert armed.status_code == 200
    assert [(f["target"], f["mode"], f["delay_seconds"], f["remaining"]) for f in armed.json()["faults"]] == [
        ("refund", "timeout_after_booking", 1.5, -1)
    ]
    assert client.get("/sim/faults").json()["faults"][0]["mode"] == "timeout_after_booking"
    assert client.delete("/sim/faults").json() == {"cleared": 1}
    assert client.get("/sim/faults").json() == {"faults": []}


def test_bad_fault_is_400(client):
    client.force_login(_fault_armer())
    for body in ({"target": "moon", "mode": "delay"}, {"target": "refund", "mode": "explode"},
                 {"target": "refund", "mode": "delay", "count": 0}, {"target": "refund", "mode": "delay", "delay_seconds": "x"},
                 {"target": "refund", "mode": "delay", "count": 10**10}):
        response = client.post("/sim/faults", body, content_type="application/json")
        assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_fault"), body
    assert not SimFault.objects.exists()


def test_fault_changes_need_a_csrf_token_from_a_browser_session():
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(_fault_armer())
    body = {"target": "refund", "mode": "delay"}
    forged = browser.post("/sim/faults", body, content_type="application/json")
    assert (forged.status_code, forged.json()["error"]["code"]) == (403, "csrf_failed")
    token = _get_new_csrf_string()
    browser.cookies["csrftoken"] = token
    genuine = browser.post("/sim/faults", body, content_type="application/json", headers={"X-CSRFToken": token})
    assert genuine.status_code == 200
    assert browser.get("/sim/faults").status_code == 200  # reading needs no token
