"""The client's tests: warden_client (the package in client/, installed into the virtualenv by
`make test` as `pip install -e client`) against real web servers the suite starts, with keys of a
customer and of an operator."""

import pytest

from tests.support.api import OPERATOR_PERMISSIONS, grant
from tests.support.factories import ApiKeyFactory, UserFactory


@pytest.fixture
def customer(transactional_db):
    return UserFactory(username="alice")


@pytest.fixture
def customer_key(customer) -> str:
    return ApiKeyFactory(owner=customer).secret


@pytest.fixture
def operator_key(transactional_db) -> str:
    operator = grant(UserFactory(username="desk-operator", is_staff=True), *OPERATOR_PERMISSIONS)
    return ApiKeyFactory(owner=operator).secret
