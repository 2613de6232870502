"""Every model of the project has a factory (tests/support/factories.py), and each factory makes a
row PostgreSQL accepts — constraints, triggers and all."""

import factory
import pytest
from django.apps import apps

from tests.support import factories

PROJECT_APPS = ("runs_app", "tools_app", "agents", "sessions_app", "approvals_app", "notifications", "operations", "demo")


def _factories() -> dict:
    found = {}
    for value in vars(factories).values():
        if isinstance(value, type) and issubclass(value, factory.django.DjangoModelFactory) and value._meta.model:
            model = value._meta.model
            found[apps.get_model(model) if isinstance(model, str) else model] = value
    return found


def _models() -> list:
    return [model for label in PROJECT_APPS for model in apps.get_app_config(label).get_models()
            if not model._meta.proxy]


def test_every_model_has_a_factory():
    missing = [model._meta.label for model in _models() if model not in _factories()]
    assert missing == []


@pytest.mark.django_db
@pytest.mark.parametrize("model", _models(), ids=lambda model: model._meta.label)
def test_each_factory_makes_a_row_the_database_accepts(model):
    made = _factories()[model]()
    assert model.objects.filter(pk=made.pk).exists()
