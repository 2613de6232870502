"""The desk's search by business key: a GIN index (jsonb_ops) on the tool calls' arguments, which
answers `arguments @? '$.** ? (@ == "9527")'` — an order number, or any other argument's value —
without reading every call (tools_app.selectors.tool_calls_matching); and the desk's list of
tool calls newest first."""

import django.contrib.postgres.indexes
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tools_app", "0003_unknown_tool_call_queue"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="toolcall",
            index=django.contrib.postgres.indexes.GinIndex(fields=["arguments"], name="tool_call_arguments_search"),
        ),
        migrations.AddIndex(
            model_name="toolcall",
            index=models.Index(fields=["-created_at", "-id"], name="tool_call_recent"),
        ),
    ]
