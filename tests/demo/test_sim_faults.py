"""Arming and consuming faults through the service functions other test suites use."""

import pytest

from demo.models import SimFault, SimFaultMode, SimFaultTarget
from demo.selectors import sim_fault_list
from demo.services import SimError, sim_fault_clear, sim_fault_consume, sim_fault_set


@pytest.mark.django_db
def test_a_fault_applies_to_count_requests_then_stops():
    sim_fault_set(target="refund", mode="delay", delay_seconds=0.1, count=2)
    taken = [sim_fault_consume(target=SimFaultTarget.REFUND) for _ in range(3)]
    assert [fault.mode if fault else None for fault in taken] == ["delay", "delay", None]
    assert sim_fault_consume(target=SimFaultTarget.ORDER) is None


@pytest.mark.django_db
def test_a_fault_with_count_minus_one_lasts_until_cleared():
    sim_fault_set(target="weather", mode="error_before_booking", count=-1)
    assert all(sim_fault_consume(target="weather") for _ in range(5))
    assert sim_fault_clear() == 1
    assert sim_fault_consume(target="weather") is None


@pytest.mark.django_db
def test_setting_a_target_again_replaces_its_fault_and_none_disarms_it():
    sim_fault_set(target="refund", mode="delay")
    sim_fault_set(target="refund", mode="drop_after_booking")
    assert [(f["mode"], f["delay_seconds"], f["remaining"]) for f in sim_fault_list()] == [("drop_after_booking", 3.0, 1)]
    assert sim_fault_set(target="refund", mode=SimFaultMode.NONE) is None
    assert not SimFault.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "kwargs",
    [{"target": "moon", "mode": "delay"}, {"target": "refund", "mode": "melt"},
     {"target": "refund", "mode": "delay", "count": 0}, {"target": "refund", "mode": "delay", "delay_seconds": -1}],
)
def test_invalid_faults_are_refused(kwargs):
    with pytest.raises(SimError):
        sim_fault_set(**kwargs)


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_take_a_single_use_fault_once(concurrently):
    sim_fault_set(target="refund", mode="error_before_booking", count=1)
    taken = concurrently(lambda i: sim_fault_consume(target="refund"), 10)
    assert not any(isinstance(result, Exception) for result in taken), taken
    assert sum(result is not None for result in taken) == 1
