"""Every answer names its request (X-Request-ID): the caller's own id when it is a plain token — a
proxy's or a client's, so one id follows the request through every hop — a new one otherwise; the
log lines of the request carry the same id (tests/api/test_errors.py, the 500)."""

import re

import pytest

pytestmark = pytest.mark.django_db


def test_every_answer_names_a_request_id_of_its_own(alice_api, client):
    first, second = alice_api.get("/me"), alice_api.get("/me")
    assert first.status_code == 200 and re.fullmatch(r"[0-9a-f]{32}", first["X-Request-ID"])
    assert first["X-Request-ID"] != second["X-Request-ID"]
    refused = client.get("/api/v1/me")  # a refusal too, and a page that is not the API's
    assert refused.status_code == 401 and refused.has_header("X-Request-ID")
    assert client.get("/healthz").has_header("X-Request-ID")


def test_a_callers_own_id_is_kept(alice_api):
    response = alice_api.client.get("/api/v1/me", HTTP_X_REQUEST_ID="req_2f9c:edge-7.1", **alice_api.headers)
    assert response["X-Request-ID"] == "req_2f9c:edge-7.1"


@pytest.mark.parametrize("offered", ["", "short", "two words here", "x" * 129, "a\\u00e9bcdefgh", "id;drop=1234"])
def test_an_id_that_is_not_a_plain_token_is_replaced(alice_api, offered):
    response = alice_api.client.get("/api/v1/me", HTTP_X_REQUEST_ID=offered, **alice_api.headers)
    assert response.status_code == 200
    assert response["X-Request-ID"] != offered and re.fullmatch(r"[0-9a-f]{32}", response["X-Request-ID"])
