"""`manage.py create_api_key <username> <name>`: a new API key; the secret is printed once."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from sessions_app.api_keys import api_key_create


class Command(BaseCommand):
    help = "Create an API key for a user and print its secret (shown only this once)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("name", help="what the key is for, e.g. 'billing-integration'")

    def handle(self, *args, username, name, **options):
        try:
            owner = get_user_model().objects.get_by_natural_key(username)
        except get_user_model().DoesNotExist as exc:
            raise CommandError(f"No user named {username!r}.") from exc
        if not owner.is_active:
            raise CommandError(f"User {username!r} is inactive; its keys would not authenticate.")
        api_key, secret = api_key_create(owner=owner, name=name)
        self.stderr.write(f"API key {api_key.name!r} ({api_key.prefix}) for {username}. Store the secret now; it cannot be shown again:")
        self.stdout.write(secret)
