"""The table of Django's database cache, the shared cache when REDIS_URL is unset (the API's rate
limits count there; config/settings.py CACHES). Created here so every `migrate` has it, whatever
CACHES says at the time; `createcachetable` would create it only for a configured database cache."""

from django.core.management.commands.createcachetable import Command as CreateCacheTable
from django.db import migrations

CACHE_TABLE = "warden_cache"


def create_cache_table(apps, schema_editor):
    command = CreateCacheTable()
    command.verbosity = 0
    command.create_table(schema_editor.connection.alias, CACHE_TABLE, dry_run=False)


def drop_cache_table(apps, schema_editor):
    schema_editor.execute(f"DROP TABLE IF EXISTS {schema_editor.quote_name(CACHE_TABLE)}")


class Migration(migrations.Migration):

    dependencies = [
        ("sessions_app", "0005_erasure_through_one_path"),
    ]

    operations = [
        migrations.RunPython(create_cache_table, drop_cache_table),
    ]
