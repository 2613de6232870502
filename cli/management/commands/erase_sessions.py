"""Retention and erasure: archive sessions to a file, then erase them (engine/actions/retention.py).

  manage.py erase_sessions --archive erased.jsonl                  # older than WARDEN_RETENTION_DAYS
  manage.py erase_sessions --older-than 90 --archive erased.jsonl
  manage.py erase_sessions --user alice --archive alice.jsonl --by operator --reason "erasure request #42"

"Older than N days" means no activity (no message, no run) for N days. A session whose run is
still active is never touched (it is reported and left for a later pass). --dry-run lists what
would go."""

from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from engine.actions.retention import sessions_erase
from sessions_app.models import Session


class Command(BaseCommand):
    help = "Archive sessions to a file, then erase them: past the retention period, or one user's."

    def add_arguments(self, parser):
        parser.add_argument("--older-than", type=int, metavar="DAYS", help="default WARDEN_RETENTION_DAYS")
        parser.add_argument("--user", metavar="USERNAME", help="erase this user's sessions (an erasure request)")
        parser.add_argument("--archive", metavar="PATH", help="JSON lines file the sessions are written to first (appended)")
        parser.add_argument("--by", metavar="USERNAME", help="who asks, for the audit trail")
        parser.add_argument("--reason", default="", help="why, for the audit trail")
        parser.add_argument("--dry-run", action="store_true")

    def handle(self, *args, older_than, user, archive, by, reason, dry_run, **options):
        User = get_user_model()
        if older_than is None and user is None:
            older_than = settings.WARDEN_RETENTION_DAYS
            if older_than is None:
                raise CommandError("Say which sessions: --older-than DAYS, --user USERNAME, or set WARDEN_RETENTION_DAYS.")
        if older_than is not None and older_than < 0:
            raise CommandError("--older-than must be 0 or more days.")
        sessions = Session.objects.all()
        if user is not None:
            owner = User.objects.filter(username=user).first()
            if owner is None:
                raise CommandError(f"No user {user!r}.")
            sessions = sessions.filter(owner=owner)
        if older_than is not None:
            sessions = sessions.filter(updated_at__lt=timezone.now() - timedelta(days=older_than))
        actor = None
        if by is not None:
            actor = User.objects.filter(username=by).first()
            if actor is None:
                raise CommandError(f"No user {by!r} (--by).")
        if dry_run:
            for session in sessions.order_by("updated_at"):
                self.stdout.write(f"would erase {session.pk} ({session.owner}, last active {session.updated_at:%Y-%m-%d})")
            return
        if not archive:
            raise CommandError("--archive PATH is required: sessions are archived before they are erased.")
        path = Path(archive)
        with path.open("a", encoding="utf-8") as out:
            report = sessions_erase(sessions=sessions, archive=out, acting_user=actor,
                                    reason=reason or ("retention period" if user is None else f"erasure of {user}'s sessions"))
        self.stdout.write(self.style.SUCCESS(
            f"erased {len(report.erased)} session(s), {report.messages} message(s), {report.runs} run(s); "
            f"archived to {path}"))
        for session_id in report.skipped_active:
            self.stdout.write(self.style.WARNING(f"left {session_id}: its run is still active"))
