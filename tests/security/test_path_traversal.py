"""Paths that climb out of the static folders, sent byte for byte as an attacker's raw request
(`curl --path-as-is`: HTTP clients would normalise the `..` away) to a real daphne: a 404 like any
missing file, never a 500 and never a file from outside."""

import pytest

from tests.support.raw_http import raw_get

pytestmark = pytest.mark.processes

TRAVERSALS = [
    "/static/../../etc/passwd",
    "/static/admin/../../../../../../etc/passwd",
    "/static/..%2f..%2f..%2fetc/passwd",
    "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/static/admin/%00",
    "/console/assets/../../../../../../etc/passwd",
    "/console/assets/..%2f..%2fconsole%2fviews.py",
    "/console/assets/%2e%2e/%2e%2e/%2e%2e/config/settings.py",
]


def test_climbing_out_of_the_static_folders_is_a_404(procs):
    procs.start_web()
    assert raw_get(procs.port, "/static/admin/css/base.css")[0] == 200
    assert raw_get(procs.port, "/console/assets/console.js")[0] == 200
    answers = {target: raw_get(procs.port, target) for target in TRAVERSALS}
    assert {target: status for target, (status, _) in answers.items()} == {target: 404 for target in TRAVERSALS}
    assert not any(b"root:" in body or b"SECRET_KEY" in body for _, body in answers.values())
