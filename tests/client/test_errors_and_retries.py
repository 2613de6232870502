"""The client's error model and retries, against scripted answers (httpx.MockTransport): each of
the API's error bodies becomes the typed exception of its status carrying the code, message,
fields and request id; a write keeps its one Idempotency-Key across retries; what is retried
(connection failures, dropped answers, 5xx, 429, a key still in use) and what is not."""

import asyncio
import json

import httpx
import pytest

from warden_client import (
    APIConnectionError, AsyncWarden, ConflictError, NotFoundError, PermissionDeniedError, RateLimitedError, RetryPolicy,
    ServerError, ValidationError, Warden,
)
from warden_client._core import Call
from warden_client.errors import error_from_response

NO_WAIT = RetryPolicy(max_attempts=4, backoff=0.0)
SESSION = {"id": "5b9c3b0e-6f35-4a53-9e1d-2f0c7e1b9a10", "title": "refunds", "owner": "alice", "agent": "refund-desk",
           "active_run_id": None, "message_count": 0, "created_at": "2026-01-01T10:00:00Z",
           "updated_at": "2026-01-01T10:00:00Z"}


def scripted(*answers, seen: list | None = None) -> Warden:
    """A client whose requests get `answers` in turn: an httpx.Response, or an exception to raise."""
    queue = list(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        answer = queue.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    http = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://warden.test")
    return Warden("http://warden.test", "wdn_test", retry=NO_WAIT, http_client=http)


def refusal(status: int, code: str, message: str = "no", **extra) -> httpx.Response:
    headers = extra.pop("headers", {})
    return httpx.Response(status, json={"code": code, "message": message, **extra}, headers=headers)


@pytest.mark.parametrize(("status", "code", "kind"), [
    (404, "not_found", NotFoundError), (403, "budget_over_cap", PermissionDeniedError),
    (409, "run_terminal", ConflictError), (422, "unknown_query_parameter", ValidationError),
])
def test_an_error_answer_is_the_typed_exception_of_its_status_with_the_apis_code(status, code, kind):
    client = scripted(refusal(status, code, "what went wrong", headers={"X-Request-ID": "req-42"}))
    with pytest.raises(kind) as raised:
        client.runs.get("3f1e")
    error = raised.value
    assert (error.code, error.message, error.status, error.request_id) == (code, "what went wrong", status, "req-42")
    assert str(error) == f"{code} ({status}): what went wrong [request req-42]"


def test_validation_fields_come_with_the_error():
    fields = [{"field": "query.stauts", "message": "not a parameter of this endpoint", "type": "unknown_query_parameter"}]
    error = error_from_response(422, httpx.Headers(), json.dumps({"code": "unknown_query_parameter", "message": "x",
                                                                 "fields": fields}).encode())
    assert isinstance(error, ValidationError) and error.fields == fields


def test_an_answer_that_is_not_the_error_model_still_has_a_code():
    client = scripted(*[httpx.Response(502, text="<html>bad gateway</html>")] * 4)
    with pytest.raises(ServerError) as raised:
        client.me()
    assert (raised.value.code, raised.value.status) == ("http_502", 502)


def test_a_write_keeps_one_idempotency_key_across_its_retries_and_each_call_gets_its_own():
    seen: list[httpx.Request] = []
    client = scripted(
        refusal(503, "try_again", headers={"Retry-After": "0"}),
        httpx.RemoteProtocolError("peer closed connection without sending complete message body"),
        refusal(409, "idempotency_key_in_use", headers={"Retry-After": "0"}),
        httpx.Response(201, json=SESSION, headers={"Idempotent-Replayed": "true"}),
        httpx.Response(201, json=SESSION),
        seen=seen,
    )
    first = client.sessions.create(title="refunds")
    second = client.sessions.create(title="refunds")
    keys = [request.headers["Idempotency-Key"] for request in seen]
    assert len(set(keys[:4])) == 1 and keys[4] != keys[0]
    assert [json.loads(request.content) for request in seen] == [{"title": "refunds"}] * 5
    assert first.id == SESSION["id"] and first.replayed and not second.replayed


def test_gets_carry_no_key_and_are_retried_after_connection_errors():
    seen: list[httpx.Request] = []
    client = scripted(httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), httpx.Response(200, json=SESSION | {
        "messages": [], "pending_inputs": []}), seen=seen)
    assert client.sessions.get(SESSION["id"]).title == "refunds"
    assert len(seen) == 3 and "Idempotency-Key" not in seen[0].headers


def test_what_a_retry_cannot_change_is_not_retried():
    seen: list[httpx.Request] = []
    client = scripted(refusal(409, "idempotency_key_reused"), refusal(404, "not_found"), seen=seen)
    with pytest.raises(ConflictError):
        client.sessions.say(SESSION["id"], "hello")
    with pytest.raises(NotFoundError):
        client.runs.get("x")
    assert len(seen) == 2


def test_retries_end_with_the_last_error():
    client = scripted(*[refusal(429, "throttled", headers={"Retry-After": "0"})] * 4)
    with pytest.raises(RateLimitedError) as raised:
        client.runs.list()
    assert raised.value.retry_after == 0
    client = scripted(*[httpx.ConnectError("refused")] * 4)
    with pytest.raises(APIConnectionError) as refused:
        client.runs.list()
    assert refused.value.code == "connection_error" and "4 attempts" in refused.value.message


def test_the_wait_before_a_retry_is_the_servers_retry_after_when_it_sends_one():
    policy = RetryPolicy(max_attempts=3, backoff=0.5, max_backoff=8, max_retry_after=60)
    call = Call("POST", "/sessions", dict)
    throttled = refusal(429, "throttled", headers={"Retry-After": "7"})
    assert policy.after_response(call, 1, throttled) == 7
    assert policy.after_response(call, 1, refusal(429, "throttled", headers={"Retry-After": "999"})) == 60
    assert 0.25 <= policy.after_response(call, 2, refusal(500, "internal_error")) <= 1.0
    assert policy.after_response(call, 3, throttled) is None  # the attempts are used up
    assert policy.after_response(call, 1, refusal(400, "bad_request")) is None


def test_the_async_client_shares_the_same_calls_and_retries():
    seen: list[httpx.Request] = []
    answers = [refusal(503, "try_again", headers={"Retry-After": "0"}), httpx.Response(201, json=SESSION),
               refusal(404, "not_found")]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0)

    async def scenario():
        http = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://warden.test")
        async with AsyncWarden("http://warden.test", "wdn_test", retry=NO_WAIT, http_client=http) as client:
            session = await client.sessions.create(title="refunds")
            with pytest.raises(NotFoundError):
                await client.runs.get("x")
            return session

    session = asyncio.run(scenario())
    assert session.title == "refunds"
    assert seen[0].headers["Idempotency-Key"] == seen[1].headers["Idempotency-Key"]
    assert seen[0].headers["Authorization"] == "Bearer wdn_test"
