"""The simulated gateway's booking rules, straight through its service function."""

import threading
import time
from decimal import Decimal

import pytest
from django.db import connection, transaction

from tests.support.factories import SimOrderFactory, SimRefundFactory
from demo.models import SimRefund
from demo.selectors import sim_refund_count
from demo.services import SimError, sim_refund_book


def book(order_id="9527", amount="25.00", key="key-1", reason="customer request"):
    return sim_refund_book(order_id=order_id, amount=Decimal(amount), reason=reason, idempotency_key=key)


@pytest.mark.django_db
def test_same_key_twice_returns_the_same_refund_and_books_once():
    SimOrderFactory(order_id="9527")
    first, first_replayed = book()
    second, second_replayed = book(amount="25")
    assert (first_replayed, second_replayed) == (False, True)
    assert second.refund_id == first.refund_id
    assert sim_refund_count(order_id="9527") == 1


@pytest.mark.django_db
def test_reused_key_with_another_amount_or_order_is_refused():
    SimOrderFactory(order_id="9527")
    SimOrderFactory(order_id="9529", amount=Decimal("120.00"))
    book()
    with pytest.raises(SimError) as other_amount:
        book(amount="20.00")
    with pytest.raises(SimError) as other_order:
        book(order_id="9529", amount="25.00")
    assert (other_amount.value.status, other_amount.value.code) == (422, "idempotency_key_reused")
    assert other_order.value.code == "idempotency_key_reused"
    assert sim_refund_count() == 1


@pytest.mark.django_db
def test_ineligible_order_is_refused_and_nothing_booked():
    SimOrderFactory(order_id="9528", refund_eligible=False, ineligible_reason="delivered more than 30 days ago")
    with pytest.raises(SimError) as refused:
        book(order_id="9528")
    assert (refused.value.status, refused.value.code) == (409, "not_eligible")
    assert "30 days" in refused.value.detail
    assert sim_refund_count() == 0


@pytest.mark.django_db
def test_already_refunded_order_is_refused_under_another_key():
    SimRefundFactory(order=SimOrderFactory(order_id="9527"), idempotency_key="first")
    with pytest.raises(SimError) as refused:
        book(key="second")
    assert (refused.value.status, refused.value.code) == (409, "already_refunded")
    assert sim_refund_count(order_id="9527") == 1


@pytest.mark.django_db
def test_unknown_order_and_excessive_amount_are_refused():
    SimOrderFactory(order_id="9527", amount=Decimal("25.00"))
    with pytest.raises(SimError) as unknown:
        book(order_id="0000")
    with pytest.raises(SimError) as too_much:
        book(amount="25.01")
    assert (unknown.value.status, unknown.value.code) == (404, "order_not_found")
    assert (too_much.value.status, too_much.value.code) == (422, "amount_exceeds_order")
    assert sim_refund_count() == 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_with_one_key_book_exactly_one_refund(concurrently):
    SimOrderFactory(order_id="9527")
    results = concurrently(lambda i: book(), 12)
    assert all(not isinstance(result, Exception) for result in results), results
    assert len({refund.refund_id for refund, _ in results}) == 1
    assert [replayed for _, replayed in results].count(False) == 1
    assert sim_refund_count(order_id="9527") == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_with_one_key_for_different_orders_book_once(concurrently):
    for n in range(8):
        SimOrderFactory(order_id=f"70{n}")
    results = concurrently(lambda i: book(order_id=f"70{i}", key="shared"), 8)
    booked = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, SimError)]
    assert len(booked) == 1 and len(refused) == 7
    assert {error.code for error in refused} == {"idempotency_key_reused"}
    assert sim_refund_count() == 1


def _wait_until_a_backend_waits_for_a_lock():
    with connection.cursor() as cursor:
        for _ in range(200):
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.05)
    raise AssertionError("the second booking never blocked on the first one's key")


@pytest.mark.django_db(transaction=True)
def test_losing_the_insert_race_on_a_key_answers_from_the_winners_refund():
    """The other request passed every check before the winner committed; the unique key
    stops its insert, and it answers with what the key already booked."""
    winner_order, loser_order = SimOrderFactory(order_id="801"), SimOrderFactory(order_id="802")
    inserted, release, outcome = threading.Event(), threading.Event(), {}

    def winner():
        try:
            with transaction.atomic():
                SimRefundFactory(order=winner_order, idempotency_key="raced")
                inserted.set()
                release.wait(10)
        finally:
            connection.close()

    def loser():
        try:
            outcome["result"] = book(order_id=loser_order.order_id, key="raced")
        except Exception as exc:
            outcome["result"] = exc
        finally:
            connection.close()

    winner_thread = threading.Thread(target=winner)
    winner_thread.start()
    inserted.wait(10)
    loser_thread = threading.Thread(target=loser)
    loser_thread.start()
    _wait_until_a_backend_waits_for_a_lock()
    release.set()
    winner_thread.join()
    loser_thread.join()
    assert isinstance(outcome["result"], SimError)
    assert outcome["result"].code == "idempotency_key_reused"
    assert list(SimRefund.objects.values_list("order__order_id", flat=True)) == ["801"]
