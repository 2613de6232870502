"""The desk's two roles ship as groups (issue 28: a new deployment had none, and docs told an
administrator to grant "decide_approval", a name the admin's permission picker does not show).
An administrator puts people in them (*Authentication and Authorization › Users*, staff status and
a group) instead of picking permissions one by one; docs/SECURITY.md says what each holds."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

OPERATORS = [
    "approvals_app.view_approval", "approvals_app.decide_approval",
    "tools_app.view_toolcall", "tools_app.reconcile_toolcall",
    "runs_app.view_run", "runs_app.change_run",
    "sessions_app.view_session", "agents.view_agent",
]
LEADS = OPERATORS + [
    "approvals_app.freeze_money", "approvals_app.view_auditentry",
    "runs_app.exceed_budget_caps", "agents.change_agent",
    "notifications.view_webhookendpoint", "notifications.add_webhookendpoint",
    "notifications.change_webhookendpoint", "notifications.view_webhookdelivery",
    "notifications.change_webhookdelivery",
]
ROLES = {"Operators": OPERATORS, "Leads": LEADS}


def groups_create(apps, schema_editor):
    # Permissions are made after migrations (post_migrate); these groups need them now.
    # A migration's app configs have no models module, which create_permissions skips: one is lent
    # for the call and the config given back as it was (called with the project's registry — a test
    # making the groups again — a None left behind would make every later post_migrate skip every app).
    for app_config in apps.get_app_configs():
        models_module = getattr(app_config, "models_module", None)
        app_config.models_module = models_module or True
        try:
            create_permissions(app_config, apps=apps, verbosity=0)
        finally:
            app_config.models_module = models_module
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, labels in ROLES.items():
        group, _ = Group.objects.get_or_create(name=name)
        for label in labels:
            app_label, codename = label.split(".")
            group.permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))


def groups_remove(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("operations", "0002_open_stream"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("approvals_app", "0010_edit_on_approve"),
        ("runs_app", "0018_run_forked_from"),
        ("tools_app", "0009_edit_on_approve"),
        ("sessions_app", "0010_rate_counter"),
        ("agents", "0002_write_caps_and_limits"),
        ("notifications", "0001_initial"),
    ]

    operations = [migrations.RunPython(groups_create, groups_remove)]
