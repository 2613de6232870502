"""Export the tamper-evident ledger for a SIEM (docs/LEDGER.md): the entries of a time range, as JSON
lines or CSV, each with its seq, hash and prev_hash. `GET /api/v1/ledger` answers the same.

  manage.py export_ledger --from 2026-12-01T00:00:00Z --to 2026-12-02T00:00:00Z --format jsonl
  manage.py export_ledger --from 2026-12-01 --format csv --output ledger-december.csv

--from is inclusive, --to exclusive (both ISO 8601, UTC when no offset is given); without them, from
the first entry, up to now. Without --output the export goes to standard output."""

from datetime import datetime, time, timezone as dt_timezone

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_date, parse_datetime

from approvals_app.ledger import EXPORT_FORMATS, ledger_export


def _moment(text: str | None, option: str) -> datetime | None:
    if text is None:
        return None
    try:
        moment = parse_datetime(text)
        if moment is None and (day := parse_date(text)) is not None:
            moment = datetime.combine(day, time.min)
    except ValueError:
        moment = None
    if moment is None:
        raise CommandError(f"{option} {text!r} is not an ISO 8601 date or date and time.")
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt_timezone.utc)


class Command(BaseCommand):
    help = "Export the ledger's entries of a time range as JSON lines or CSV."

    def add_arguments(self, parser):
        parser.add_argument("--from", dest="since", metavar="ISO", help="inclusive; default: the first entry")
        parser.add_argument("--to", dest="until", metavar="ISO", help="exclusive; default: now")
        parser.add_argument("--format", dest="fmt", choices=EXPORT_FORMATS, default="jsonl")
        parser.add_argument("--output", metavar="FILE", help="write here (replaced) instead of standard output")

    def handle(self, *args, since, until, fmt, output, **options):
        since, until = _moment(since, "--from"), _moment(until, "--to")
        if since is not None and until is not None and since >= until:
            raise CommandError("--from must be before --to.")
        if output is None:
            for chunk in ledger_export(since=since, until=until, fmt=fmt):
                self.stdout.write(chunk, ending="")
            return
        # newline="": the CSV rows keep their own line ends.
        with open(output, "w", encoding="utf-8", newline="") as out:
            for chunk in ledger_export(since=since, until=until, fmt=fmt):
                out.write(chunk)
