"""A database of the release before the floor plan (9ce29d6: agents, the webhook outbox and process
heartbeats in runs_app) migrates forward with every row kept: the tables stay, Django's state
moves, and the content types are relabelled so that the permissions granted on the old labels
hold on the new ones. The old database is built from the old migrations' own state."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

# The leaf of every app's migrations at 9ce29d6; the apps that did not exist yet, unmigrated.
BEFORE_THE_FLOOR_PLAN = [
    ("runs_app", "0014_fk_indexes_covered"),
    ("sessions_app", "0008_fk_indexes_covered"),
    ("approvals_app", "0007_agents"),
    ("tools_app", "0006_partial_fk_indexes"),
    ("demo", "0003_fault_target_lookup"),
    ("agents", None),
    ("notifications", None),
    ("operations", None),
]
MOVED = {"agent": "agents", "agentversion": "agents", "processheartbeat": "operations",
         "webhookendpoint": "notifications", "webhookdelivery": "notifications", "webhookattempt": "notifications"}


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    executor.loader.build_graph()
    named = {app for app, _ in targets}
    nodes = [node for node in executor.loader.graph.leaf_nodes() if node[0] not in named]
    return executor.loader.project_state(nodes + [target for target in targets if target[1] is not None]).apps


def _latest():
    executor = MigrationExecutor(connection)
    return executor.loader.graph.leaf_nodes()


@pytest.fixture
def old_database(transactional_db):
    """The test database taken back to 9ce29d6's migrations, and brought to today's at the end
    whatever the test found (the next test needs it)."""
    apps = _migrate(BEFORE_THE_FLOOR_PLAN)
    yield apps
    _migrate(_latest())


def test_a_database_of_9ce29d6_keeps_every_row_and_permission(old_database):
    apps = old_database
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    User = apps.get_model("auth", "User")
    # What 9ce29d6's post_migrate left: the moved models' content types and permissions under runs_app.
    assert set(ContentType.objects.filter(model__in=MOVED).values_list("app_label", flat=True)) == {"runs_app"}
    editor = User.objects.create(username="agent-editor", is_staff=True)
    editor.user_permissions.add(Permission.objects.get(content_type__app_label="runs_app", codename="change_agent"),
                                Permission.objects.get(content_type__app_label="runs_app", codename="view_webhookdelivery"))

    Agent = apps.get_model("runs_app", "Agent")
    AgentVersion = apps.get_model("runs_app", "AgentVersion")
    Session = apps.get_model("sessions_app", "Session")
    Run = apps.get_model("runs_app", "Run")
    agent = Agent.objects.create(slug="support", name="Support")
    version = AgentVersion.objects.create(agent=agent, number=1, name="Support", instructions="Help.", provider="scripted",
                                          created_by=editor)
    Agent.objects.filter(pk=agent.pk).update(current_version=version)
    owner = User.objects.create(username="alice")
    session = Session.objects.create(owner=owner, agent=agent)
    run = Run.objects.create(session=session, created_by=owner, agent_version=version,
                             max_model_calls=10, max_tokens=1000, deadline=timezone.now())
    apps.get_model("runs_app", "ProcessHeartbeat").objects.create(
        identity="vm:1:w", role="worker", host="vm", pid=1, started_at=timezone.now(), beat_at=timezone.now())
    endpoint = apps.get_model("runs_app", "WebhookEndpoint").objects.create(name="billing", url="https://hooks.example/warden")
    apps.get_model("runs_app", "WebhookDelivery").objects.create(endpoint=endpoint, kind="run.completed",
                                                                 body={"type": "run.completed", "timestamp": "t", "data": {}})

    _migrate(_latest())

    from django.contrib.auth.models import User as CurrentUser
    from django.contrib.contenttypes.models import ContentType as CurrentContentType

    from agents.models import Agent as AgentNow
    from notifications.models import WebhookDelivery
    from operations.models import ProcessHeartbeat
    from runs_app.models import Run as RunNow
    from sessions_app.models import Session as SessionNow

    CurrentContentType.objects.clear_cache()
    moved = dict(CurrentContentType.objects.filter(model__in=MOVED).values_list("model", "app_label"))
    assert moved == MOVED
    assert not CurrentContentType.objects.filter(app_label="runs_app", model__in=MOVED).exists()
    editor = CurrentUser.objects.get(username="agent-editor")
    assert editor.has_perm("agents.change_agent") and editor.has_perm("notifications.view_webhookdelivery")
    agent = AgentNow.objects.get(slug="support")
    assert agent.current_version.created_by == editor
    assert SessionNow.objects.get(pk=session.pk).agent == agent
    assert RunNow.objects.get(pk=run.pk).agent_version == agent.current_version
    assert ProcessHeartbeat.objects.filter(identity="vm:1:w").exists()
    assert WebhookDelivery.objects.get().endpoint.name == "billing"
