"""The API documents itself: OpenAPI at /api/v1/openapi.json, interactive docs at /api/v1/docs."""

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_openapi_schema_and_docs_are_served():
    schema = Client().get("/api/v1/openapi.json").json()
    assert schema["info"]["title"] == "Warden API"
    assert {"ApiKeyAuth", "SessionCookieAuth"} <= set(schema["components"]["securitySchemes"])
    assert schema["components"]["securitySchemes"]["ApiKeyAuth"]["scheme"] == "bearer"
    assert Client().get("/api/v1/docs").status_code == 200


def test_every_operation_is_authenticated_and_documents_its_errors():
    schema = Client().get("/api/v1/openapi.json").json()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            assert operation["security"], f"{method} {path} is not authenticated"
            assert "401" in operation["responses"], f"{method} {path} does not document 401"
            assert operation["operationId"].replace("_", "").isalpha()
