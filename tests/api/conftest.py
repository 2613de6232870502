"""The API tests' callers (tests/support/api.py builds them) and their world."""

import pytest

from tests.support.api import OPERATOR_PERMISSIONS, Api, World, build_world, grant
from tests.support.factories import ApiKeyFactory, UserFactory


@pytest.fixture
def alice(db):
    return UserFactory(username="alice")


@pytest.fixture
def bob(db):
    return UserFactory(username="bob")


@pytest.fixture
def api_operator(db):
    return grant(UserFactory(username="operator", is_staff=True), *OPERATOR_PERMISSIONS)


@pytest.fixture
def alice_api(alice):
    return Api(ApiKeyFactory(owner=alice).secret)


@pytest.fixture
def bob_api(bob):
    return Api(ApiKeyFactory(owner=bob).secret)


@pytest.fixture
def operator_api(api_operator):
    return Api(ApiKeyFactory(owner=api_operator).secret)


@pytest.fixture
def anonymous_api(db):
    return Api()


@pytest.fixture
def world(alice) -> World:
    return build_world(alice)
