"""One error model: every refusal is a WardenError with a code from an app's enum (config/errors.py),
answered by the API's one handler with the code's status and the body {"code", "message",
"fields"?} — checked for every code of every app, through the real URL, middleware and handler."""

from importlib import import_module
from pathlib import Path

import pytest
from django.test import Client

from access import policy
from config.errors import Refusal, WardenError
from tests.support.factories import UserFactory

ROOT = Path(__file__).resolve().parents[2]


def every_refusal() -> list[Refusal]:
    """Each app's refusals (its errors.py), every member."""
    for path in sorted(ROOT.glob("*/errors.py")):
        import_module(f"{path.parent.name}.errors")
    found, pending = [], list(Refusal.__subclasses__())
    while pending:
        enum = pending.pop()
        pending += enum.__subclasses__()
        found += list(enum)
    return sorted(found, key=lambda member: (type(member).__name__, member.name))


def test_every_app_with_refusals_has_them_in_its_enum():
    enums = {type(member).__name__ for member in every_refusal()}
    assert {"CommonRefusal", "ApiRefusal", "RunRefusal", "SessionRefusal", "ToolCallRefusal", "ApprovalRefusal",
            "AgentRefusal", "ConsoleRefusal"} <= enums
    codes = [(type(member).__name__, member.value) for member in every_refusal()]
    assert len(codes) == len(set(codes)), "a code stands twice in one enum"
    assert all(100 <= member.status <= 599 for member in every_refusal())


@pytest.mark.django_db
@pytest.mark.parametrize("refusal", every_refusal(), ids=lambda member: f"{type(member).__name__}.{member.name}")
def test_each_code_is_answered_with_its_status_and_body(refusal, monkeypatch):
    def refuse(user):
        raise WardenError(refusal, f"Refused: {refusal.name.lower()}.",
                          fields=[{"field": "body.x", "message": "wrong", "type": refusal.value}])

    monkeypatch.setattr(policy, "operator_powers", refuse)
    client = Client()
    client.force_login(UserFactory())
    response = client.get("/api/v1/me")
    assert response.status_code == refusal.status
    assert response["Content-Type"].startswith("application/json")
    assert response.json() == {"code": refusal.value, "message": f"Refused: {refusal.name.lower()}.",
                               "fields": [{"field": "body.x", "message": "wrong", "type": refusal.value}]}
