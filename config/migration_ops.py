"""Operations the apps' migrations share (a database helper of the infrastructure layer)."""

from django.db import migrations


def content_types_moved(*, models: list[str], from_app: str, to_app: str) -> migrations.RunPython:
    """A model that moved to another app keeps its content type row, relabelled, so the permissions
    granted on it (and admin log entries about it) follow it instead of being left on a label that
    no longer exists. On a fresh database there is nothing to relabel yet: the rows are created
    under the new label after the migrations run."""

    def relabel(source: str, target: str):
        def run(apps, schema_editor):
            content_types = apps.get_model("contenttypes", "ContentType").objects.using(schema_editor.connection.alias)
            for model in models:
                if not content_types.filter(app_label=target, model=model).exists():
                    content_types.filter(app_label=source, model=model).update(app_label=target)
        return run

    return migrations.RunPython(relabel(from_app, to_app), relabel(to_app, from_app))
