"""The chaos tests' operator, who decides and reconciles."""

import pytest
from django.contrib.auth.models import Permission

from tests.support.factories import UserFactory


@pytest.fixture
def desk_operator(transactional_db):
    user = UserFactory(username="chaos-operator", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["decide_approval", "reconcile_toolcall"]))
    return user
