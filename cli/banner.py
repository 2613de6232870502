"""Lines other apps add to `serve_all`'s start-up banner — the demo's accounts, say — so the command
prints them without knowing them (the demo sits above the commands in the layers)."""

from typing import Callable

_SECTIONS: list[Callable[[dict[str, str]], list[str]]] = []


def banner_section_add(section: Callable[[dict[str, str]], list[str]]) -> None:
    """`section(env)` returns the lines to print, given the environment the servers start with."""
    if section not in _SECTIONS:
        _SECTIONS.append(section)


def banner_sections(env: dict[str, str]) -> list[str]:
    return [line for section in _SECTIONS for line in section(env)]
