"""Verify the tamper-evident ledger (docs/LEDGER.md): walk the chain in seq order, recompute every hash.

  manage.py verify_ledger

Prints `ledger OK: N entries, last <seq> <hash>` and exits 0; or names the first broken entry —
its seq and what is wrong (content altered, link broken, entries missing) — and exits 1."""

from django.core.management.base import BaseCommand

from approvals_app.ledger import ledger_verify


class Command(BaseCommand):
    help = "Verify the ledger's hash chain; name the first broken entry (exit status 1) or report OK."

    def handle(self, *args, **options):
        check = ledger_verify()
        if check.ok:
            self.stdout.write(self.style.SUCCESS(
                f"ledger OK: {check.entries} entries" + (f", last #{check.last_seq} {check.last_hash}" if check.entries else "")))
            return
        broken = check.broken
        self.stderr.write(self.style.ERROR(f"ledger BROKEN at entry #{broken.seq}: {broken.problem.replace('_', ' ')} — "
                                           f"{broken.detail}"))
        raise SystemExit(1)
