"""The desk's line to the simulated payment service's fault switchboard (demo mode only).

The desk's demo buttons arm faults by calling the service over HTTP at WARDEN_SIM_BASE_URL, from
the server — the same way the demo tools reach it — so they work wherever the service runs
(its own port, its own process). The call carries a token derived from SECRET_KEY, which the
service checks (demo.views.faults_view): no cookie, no browser, nothing a page could
forge. This module imports no model, so the desk may use it whether or not the demo app is
installed in this process."""

import httpx
from django.conf import settings
from django.utils.crypto import constant_time_compare, salted_hmac

DESK_TOKEN_HEADER = "X-Warden-Desk-Token"
TIMEOUT_SECONDS = 5.0

# The faults a newcomer needs to walk every path of SPEC §12 (docs/DEMO.md). The refund tool
# gives up after 2 s, so a 3 s pause after booking is a timeout after the money moved.
FAULT_PRESETS = {
    "timeout_after_booking": {
        "label": "Next refund: time out after booking",
        "help": "The gateway books the refund, then answers too late: the call is unknown until reconciliation finds it by key.",
        "fault": {"target": "refund", "mode": "timeout_after_booking", "delay_seconds": 3.0, "count": 1},
    },
    "error_before_booking": {
        "label": "Next refund: 503 before booking",
        "help": "The gateway refuses before doing anything: the call is unknown, and reconciliation settles it as not applied.",
        "fault": {"target": "refund", "mode": "error_before_booking", "count": 1},
    },
    "lookups_unavailable": {
        "label": "Lookups unavailable (reconciliation needs a person)",
        "help": "Every lookup by idempotency key fails until cleared: an unknown call waits in the queue for an operator.",
        "fault": {"target": "lookup", "mode": "error_before_booking", "count": -1},
    },
}


class SimUnavailable(Exception):
    """The simulated service could not be reached or refused the request."""


def desk_token() -> str:
    return salted_hmac("warden.demo.sim-faults", "desk").hexdigest()


def desk_token_valid(value: str | None) -> bool:
    return bool(value) and constant_time_compare(value, desk_token())


def _call(method: str, *, json: dict | None = None) -> dict:
    url = settings.WARDEN_SIM_BASE_URL.rstrip("/") + "/faults"
    try:
        with httpx.Client(timeout=TIMEOUT_SECONDS, trust_env=False) as client:
            response = client.request(method, url, json=json, headers={DESK_TOKEN_HEADER: desk_token()})
    except httpx.HTTPError as error:
        raise SimUnavailable(f"the simulated payment service at {url} did not answer: {type(error).__name__}") from error
    try:
        body = response.json()
    except ValueError as error:
        raise SimUnavailable(f"the simulated payment service answered HTTP {response.status_code}, not JSON") from error
    if response.status_code >= 400:
        detail = (body.get("error") or {}).get("detail") or response.status_code
        raise SimUnavailable(f"the simulated payment service refused: {detail}")
    return body


def sim_faults_armed() -> list[dict]:
    """What is armed now: [{target, mode, delay_seconds, remaining, created_at}]."""
    return _call("GET").get("faults", [])


def sim_fault_arm(*, preset: str) -> list[dict]:
    return _call("POST", json=FAULT_PRESETS[preset]["fault"]).get("faults", [])


def sim_faults_clear() -> int:
    return _call("DELETE").get("cleared", 0)
