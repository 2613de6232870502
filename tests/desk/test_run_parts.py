"""The desk's step and event lists as staff without runs_app.view_run see them (issue 27, finding 7):
they were 500s (the owner filter named the run table inside a subquery); now they list the steps and
events of the staff member's own runs, and nobody else's."""

import pytest

from runs_app.models import RunEvent, Step
from tests.support.desk import csrf_client
from tests.support.factories import RunEventFactory, RunFactory, SessionFactory, StepFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("model", [Step, RunEvent])
def test_staff_without_view_run_see_the_steps_and_events_of_their_own_runs_only(model):
    staff = UserFactory(username="plain-staff", is_staff=True)
    own = RunFactory(session=SessionFactory(owner=staff))
    other = RunFactory(session=SessionFactory(owner=UserFactory(username="someone-else")))
    for run in (own, other):
        StepFactory(run=run, index=0)
        RunEventFactory(run=run, seq=1, type="run_status", payload={"status": "queued"})
    response = csrf_client(staff).get(f"/admin/runs_app/{model._meta.model_name}/")
    assert response.status_code == 200, response.content[:300]
    listed = response.context["cl"].result_list
    assert {row.run_id for row in listed} == {own.pk}
