#!/usr/bin/env python
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line

    from config.errors import StartupRefused

    try:
        execute_from_command_line(sys.argv)
    except StartupRefused as refused:
        sys.exit(f"warden: {refused}")  # one line on stderr, exit status 1


if __name__ == "__main__":
    main()
