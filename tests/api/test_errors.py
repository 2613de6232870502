"""Bad input gets a clear 4xx JSON error with a stable code — never a 500, never an HTML page —
and nothing half-written remains."""

import pytest
from django.test import Client

from config.logs import RunContextFilter
from runs_app.models import Run
from sessions_app.models import Message, Session

pytestmark = pytest.mark.django_db

RUN = "6f1c2b8e-0000-4000-8000-000000000000"


def assert_error(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert isinstance(body["code"], str) and isinstance(body["message"], str) and body["message"]
    if code:
        assert body["code"] == code
    return body


@pytest.mark.parametrize("raw", ['{"content": ', "not json", "[1, 2", '{"content": "\\ud800"}'])
def test_malformed_json_is_a_4xx_and_writes_nothing(world, alice_api, raw):
    before = (Message.objects.count(), Run.objects.count())
    response = alice_api.client.post(f"/api/v1/sessions/{world.session.pk}/messages", raw,
                                     content_type="application/json", **alice_api.headers)
    assert response.status_code in (400, 422)
    assert_error(response, response.status_code)
    assert (Message.objects.count(), Run.objects.count()) == before


def test_a_body_of_the_wrong_shape_is_422(world, alice_api):
    for body in ([1, 2], "text", 42, None):
        response = alice_api.post(f"/sessions/{world.session.pk}/messages", body)
        assert_error(response, 422 if body is not None else response.status_code)
        assert response.status_code in (400, 422)


NOT_OBJECTS = ['"hello"', "[1, 2]", "123", "true", "null"]
BODY_IS_NOT_AN_OBJECT = {"field": "body", "message": "must be a JSON object", "type": "model_type"}


@pytest.mark.parametrize("raw", NOT_OBJECTS)
def test_a_session_body_that_is_not_an_object_is_422_and_creates_nothing(alice_api, raw):
    before = Session.objects.count()
    response = alice_api.client.post("/api/v1/sessions", raw, content_type="application/json", **alice_api.headers)
    body = assert_error(response, 422, "validation_error")
    assert body["fields"] == [BODY_IS_NOT_AN_OBJECT]
    assert Session.objects.count() == before


def test_every_body_of_the_api_refuses_json_that_is_not_an_object(alice_api):
    """Every operation that takes a body, as the OpenAPI schema lists them (a new one is covered
    the day it appears): a string, array, number, boolean or null body is a 422 naming `body`."""
    schema = alice_api.get("/openapi.json").json()
    with_body = [(path, method) for path, operations in schema["paths"].items()
                 for method, operation in operations.items() if "requestBody" in operation]
    assert len(with_body) >= 5, with_body
    nowhere = "6f1c2b8e-0000-4000-8000-000000000001"
    for path, method in with_body:
        url = path.replace("{session_id}", nowhere).replace("{run_id}", nowhere).replace(
            "{approval_id}", nowhere).replace("{tool_call_id}", nowhere).replace("{slug}", "nowhere").replace(
            "{freeze_id}", "999999").replace("{name}", "nowhere")
        assert method in ("post", "put", "patch") and "{" not in url, (method, path)
        send = getattr(alice_api.client, method)
        for raw in NOT_OBJECTS[:-1] if path.endswith(("/cancel", "/retry", "/fork", "/lift")) else NOT_OBJECTS:  # their bodies are optional
            response = send(url, raw, content_type="application/json", **alice_api.headers)
            body = assert_error(response, 422, "validation_error")
            assert BODY_IS_NOT_AN_OBJECT in body["fields"], (path, raw, body)


@pytest.mark.parametrize("budgets", ["lots", [1, 2], 5, True])
def test_budgets_that_are_not_an_object_are_422_not_ignored(world, alice_api, budgets):
    before = (Message.objects.count(), Run.objects.count())
    response = alice_api.post(f"/sessions/{world.session.pk}/messages", {"content": "refund 9527", "budgets": budgets})
    body = assert_error(response, 422, "validation_error")
    assert body["fields"] == [{"field": "body.budgets", "message": "must be a JSON object", "type": "model_type"}]
    assert (Message.objects.count(), Run.objects.count()) == before


@pytest.mark.parametrize("value", ["0.5", "1700000000", "-3", "1e9"])
def test_a_number_is_not_a_timestamp(alice_api, value):
    body = assert_error(alice_api.get("/runs", {"created_before": value}), 422, "validation_error")
    assert [f["field"] for f in body["fields"]] == ["query.created_before"]


def test_form_encoded_body_is_refused(world, alice_api):
    response = alice_api.client.post(f"/api/v1/sessions/{world.session.pk}/messages", {"content": "hi"}, **alice_api.headers)
    assert response.status_code in (400, 422)
    assert_error(response, response.status_code)


@pytest.mark.parametrize("path,field", [
    ("/runs/not-a-uuid", "path.run_id"),
    ("/runs/123/events", "path.run_id"),
    ("/sessions/%00/messages", "path.session_id"),
    ("/approvals/zzzz", "path.approval_id"),
    ("/tool-calls/6f1c2b8e-0000-4000-8000", "path.tool_call_id"),
])
def test_malformed_ids_in_paths_are_422_naming_the_parameter(alice_api, path, field):
    body = assert_error(alice_api.get(path), 422, "validation_error")
    assert [f["field"] for f in body["fields"]] == [field]


@pytest.mark.parametrize("params,field", [
    ({"limit": 0}, "query.limit"),
    ({"limit": 201}, "query.limit"),
    ({"limit": "10" * 20}, "query.limit"),
    ({"limit": "ten"}, "query.limit"),
    ({"status": "lost"}, "query.status.0"),
    ({"phase": "dreaming"}, "query.phase"),
    ({"wait_reason": "\x00"}, "query.wait_reason"),
    ({"session": "x"}, "query.session"),
    ({"created_after": "yesterday"}, "query.created_after"),
    ({"created_after": "0001-01-01T00:00:00+05:00"}, "query.created_after"),
    ({"created_before": "9999-12-31T23:59:59-05:00"}, "query.created_before"),
    ({"cursor": "x" * 501}, "query.cursor"),
])
def test_bad_run_list_parameters_are_422(alice_api, params, field):
    body = assert_error(alice_api.get("/runs", params), 422, "validation_error")
    assert field in [f["field"] for f in body["fields"]]


@pytest.mark.parametrize("cursor", ["garbage!", "W10", "WyJ4IiwieSJd", "WyIyMDI1LTAxLTAxIiwibm90LWEtdXVpZCJd", "bnVsbA",
                                    "1_" + "g" * 32, "123456789012345678_" + "0" * 32])
def test_damaged_cursors_are_422(alice_api, cursor):
    body = assert_error(alice_api.get("/runs", {"cursor": cursor}), 422, "validation_error")
    assert body["fields"][0]["field"] == "query.cursor"


@pytest.mark.parametrize("path", ["/sessions", "/tool-calls", "/approvals"])
def test_damaged_cursors_on_every_list_are_422(alice_api, path):
    assert_error(alice_api.get(path, {"cursor": "WyJ4Il0"}), 422, "validation_error")


@pytest.mark.parametrize("path", ["/runs", "/sessions", "/tool-calls", "/approvals"])
def test_every_cursor_the_schema_allows_is_a_position(world, alice_api, path):
    """The schema's pattern is the whole rule (issue 27, finding 11): the earliest and the latest
    positions it can name are pages, not refusals."""
    everything = [item["id"] for item in alice_api.get(path).json()["items"]]
    assert everything
    pages = []
    for cursor in ("0_" + "0" * 32, "99999999999999999_" + "f" * 32):
        response = alice_api.get(path, {"cursor": cursor})
        assert response.status_code == 200, response.content
        pages.append([item["id"] for item in response.json()["items"]])
    # Newest first (approvals: oldest first): one end of time is the whole list, the other nothing.
    assert sorted(pages) == [[], everything]


@pytest.mark.parametrize("after", [-1, 2**63, "1e3"])
def test_sequence_numbers_out_of_range_are_422(world, alice_api, after):
    assert_error(alice_api.get(f"/runs/{world.run.pk}/events", {"after": after}), 422)
    assert_error(alice_api.get(f"/sessions/{world.session.pk}/messages", {"after": after}), 422)


def test_text_postgres_cannot_store_is_refused_before_the_database(alice_api):
    before = Session.objects.count()
    body = assert_error(alice_api.post("/sessions", {"title": "a\u0000b"}), 422)
    assert body["fields"][0]["field"] == "body.title"
    assert Session.objects.count() == before


def test_a_body_over_the_upload_limit_is_a_json_413_and_writes_nothing(world, alice_api, settings):
    before = (Message.objects.count(), Run.objects.count())
    raw = '{"content": "' + "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10) + '"}'
    response = alice_api.client.post(f"/api/v1/sessions/{world.session.pk}/messages", raw,
                                     content_type="application/json", **alice_api.headers)
    assert_error(response, 413, "too_large")
    assert (Message.objects.count(), Run.objects.count()) == before


def test_unknown_endpoint_is_a_json_404():
    assert_error(Client().get("/api/v1/no/such/thing"), 404, "not_found")


def test_wrong_method_is_a_json_405(alice_api):
    response = alice_api.client.delete("/api/v1/runs", **alice_api.headers)
    body = assert_error(response, 405, "method_not_allowed")
    assert "GET" in response["Allow"] and "GET" in body["message"]


def test_unexpected_failures_are_a_json_500_and_logged(alice_api, monkeypatch, caplog):
    from api import runs as runs_api

    def boom(**kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(runs_api, "run_list", boom)
    caplog.handler.addFilter(RunContextFilter())  # as the deployment's handlers have it (config/settings.py)
    response = alice_api.get("/runs")
    body = assert_error(response, 500, "internal_error")
    assert "a bug" not in body["message"]
    assert "unhandled error on GET /api/v1/runs" in caplog.text
    # The answer names the request, and so does the line logged for it: a caller's report finds it.
    request_id = response["X-Request-ID"]
    assert f"request id {request_id}" in body["message"]
    (logged,) = [record for record in caplog.records if record.getMessage().startswith("unhandled error on GET")]
    assert logged.request_id == request_id


@pytest.mark.parametrize("query, unknown", [
    ("stauts=failed", ["stauts"]),  # a misspelt filter must not answer as if none had been asked for
    ("status=failed&colour=red&=1", ["", "colour"]),  # an empty name too (schemathesis found it)
])
def test_a_query_parameter_the_endpoint_does_not_take_is_refused_by_name(world, alice_api, query, unknown):
    body = assert_error(alice_api.get(f"/runs?{query}"), 422, "unknown_query_parameter")
    assert [f["field"] for f in body["fields"]] == [f"query.{name}" for name in unknown]
    assert "status" in body["message"]  # it says which parameters the endpoint takes
    assert alice_api.get("/runs?status=failed&limit=5").status_code == 200
    # Who asks comes first: without credentials the answer is 401, whatever the query.
    assert_error(Client().get(f"/api/v1/runs?{query}"), 401)
