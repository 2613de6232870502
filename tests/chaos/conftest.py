import pytest
from django.contrib.auth.models import Permission

from tests.factories import UserFactory
from tests.support.processes import ProcessGroup


@pytest.fixture
def procs(transactional_db, request):
    group = ProcessGroup(name=request.node.name[:60])
    yield group
    group.stop_all()


@pytest.fixture
def demo_world(transactional_db):
    from django.core.management import call_command

    call_command("seed_demo", verbosity=0)


@pytest.fixture
def desk_operator(transactional_db):
    user = UserFactory(username="chaos-operator", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["decide_approval", "reconcile_toolcall"]))
    return user
