"""docs/grafana-dashboard.json and the alert rules in docs/OPERATIONS.md use only metrics that
/metrics exposes: a renamed family breaks this test, not an operator's dashboard at 3 a.m."""

import json
import re
from pathlib import Path

import pytest

from tests.support.metrics import samples

DOCS = Path(__file__).resolve().parents[2] / "docs"
_NAME = re.compile(r"\b((?:warden|django_http)_[a-z_]+)")


def _exposed(client) -> set[str]:
    """The families /metrics declares (a family without samples yet still has its TYPE line)."""
    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 200
    text = response.content.decode()
    samples(text)  # it parses
    return {_family(name) for name in re.findall(r"^# TYPE (\S+) ", text, re.M)}


def _family(name: str) -> str:
    return re.sub(r"_(total|bucket|count|sum)$", "", name)


@pytest.mark.django_db
def test_the_dashboard_and_the_alert_rules_use_exposed_metrics(client):
    client.get("/healthz")  # one request, so django-prometheus has request series to show
    exposed = _exposed(client)
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    operations = (DOCS / "OPERATIONS.md").read_text()
    rules = operations.split("## What to alert on", 1)[1].split("## Scaling", 1)[0]
    used = {name for text in [*expressions, rules] for name in _NAME.findall(text)}
    assert used and any(n.startswith("django_http") for n in used)
    missing = sorted(n for n in used if _family(n) not in exposed)
    assert missing == [], f"not exposed at /metrics: {missing}"
    # The table of families in OPERATIONS.md lists what /metrics has, and nothing else.
    documented = {_family(n) for n in re.findall(r"`(warden_[a-z_]+)`", operations.split("## Metrics", 1)[1].split("## What", 1)[0])}
    assert documented == {f for f in exposed if f.startswith("warden_")}
