"""Panels other apps add to the desk's home page — the demo world's controls, say — so that the desk
draws them without knowing them (the demo sits above the desk in the layers and is removable)."""

from dataclasses import dataclass
from typing import Callable

from django.http import HttpRequest


@dataclass(frozen=True)
class DeskPanel:
    template: str
    # The panel's template context for this request, or None when the panel is not for them.
    context: Callable[[HttpRequest], dict | None]


_PANELS: list[DeskPanel] = []


def desk_panel_add(panel: DeskPanel) -> None:
    """Called from an app's AppConfig.ready(); adding the same panel twice adds it once."""
    if panel not in _PANELS:
        _PANELS.append(panel)


def desk_panels_for(request: HttpRequest) -> list[tuple[str, dict]]:
    """(template, context) of each panel this request may see, in the order they were added."""
    shown = []
    for panel in _PANELS:
        context = panel.context(request)
        if context is not None:
            shown.append((panel.template, context))
    return shown
