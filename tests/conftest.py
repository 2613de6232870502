import os

import pytest

_skipped: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    # In CI no test may be skipped: a skip there hides a missing dependency or feature.
    if os.environ.get("CI") and _skipped:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter:
            reporter.write_line(f"CI forbids skipped tests; skipped: {', '.join(_skipped)}", red=True)
        session.exitstatus = 1


@pytest.fixture
def operator(db):
    from django.contrib.auth.models import Permission

    from tests.factories import UserFactory

    user = UserFactory(username="op", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["decide_approval"]))
    user.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
    return user
