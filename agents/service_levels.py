"""Service levels of an agent's approval requests (docs/NOTIFICATIONS.md): per tier, whom to tell
first (`notify`, a group; left out: everyone who may decide), when to remind them and when to
escalate to a second group — `{"operator": {"notify": "operators", "remind_after": "10m",
"escalate_after": "30m", "escalate_to": "leads"}}`. Durations are written like a limit's window
(agents.limits: "<n>m|h|d"). Only the operator tier has one: a customer's confirmation is theirs
alone, and nobody else is told of it. An escalation tells more people; it never decides anything.
"""

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group

from agents.limits import WINDOW, window_of

TIERS = ("operator",)
KEYS = ("notify", "remind_after", "escalate_after", "escalate_to")
_DURATION_HELP = 'a duration like "10m", "2h" or "1d"'


def service_levels_check(value: Any, errors: dict[str, str]) -> dict[str, dict]:
    """`approval_service_levels`, normalised, or errors naming each offending field."""
    if value in (None, {}):
        return {}
    if not isinstance(value, dict):
        errors["approval_service_levels"] = 'an object {"operator": {"remind_after": "10m", …}}'
        return {}
    clean = {}
    for tier, level in value.items():
        where = f"approval_service_levels.{tier}"
        if tier not in TIERS:
            errors[where] = (f"unknown tier {tier!r}: only the operator tier has a service level "
                             "(a customer's confirmation is theirs alone)")
            continue
        if (checked := _level_check(level, where, errors)) is not None:
            clean[tier] = checked
    return clean


def _level_check(level: Any, where: str, errors: dict[str, str]) -> dict | None:
    if not isinstance(level, dict) or not level:
        errors[where] = 'an object {"notify": "<group>", "remind_after": "10m", "escalate_after": "30m", "escalate_to": "<group>"}'
        return None
    before = len(errors)
    if unknown := sorted(set(level) - set(KEYS)):
        errors[where] = f"unknown key {', '.join(map(repr, unknown))}; known: {', '.join(KEYS)}"
    clean = {}
    for key in ("notify", "escalate_to"):
        if key in level and (name := _group_check(level[key], f"{where}.{key}", errors)):
            clean[key] = name
    for key in ("remind_after", "escalate_after"):
        if key in level and (duration := _duration_check(level[key], f"{where}.{key}", errors)):
            clean[key] = duration
    if ("escalate_after" in level) != ("escalate_to" in level):
        missing = "escalate_to" if "escalate_after" in level else "escalate_after"
        errors[f"{where}.{missing}"] = "escalate_after and escalate_to go together: when, and to which group"
    if "escalate_after" in clean:
        after = window_of(clean["escalate_after"])
        if after >= timedelta(seconds=settings.WARDEN_APPROVAL_TTL_SECONDS):
            errors[f"{where}.escalate_after"] = (f"{clean['escalate_after']} is not before the request expires "
                                                 f"(WARDEN_APPROVAL_TTL_SECONDS={settings.WARDEN_APPROVAL_TTL_SECONDS}): "
                                                 "it would never escalate")
        if "remind_after" in clean and window_of(clean["remind_after"]) >= after:
            errors[f"{where}.remind_after"] = (f"{clean['remind_after']} is not before escalate_after "
                                               f"({clean['escalate_after']}): remind first, then escalate")
    elif "remind_after" in clean and window_of(clean["remind_after"]) >= timedelta(
            seconds=settings.WARDEN_APPROVAL_TTL_SECONDS):
        errors[f"{where}.remind_after"] = (f"{clean['remind_after']} is not before the request expires "
                                           f"(WARDEN_APPROVAL_TTL_SECONDS={settings.WARDEN_APPROVAL_TTL_SECONDS})")
    return clean if len(errors) == before else None


def _group_check(name: Any, where: str, errors: dict[str, str]) -> str:
    if not isinstance(name, str) or not name.strip():
        errors[where] = "the name of a group of users (the desk's Groups)"
        return ""
    if not Group.objects.filter(name=name.strip()).exists():
        known = ", ".join(Group.objects.order_by("name").values_list("name", flat=True)[:20]) or "none"
        errors[where] = f"unknown group {name.strip()!r}; groups: {known}"
        return ""
    return name.strip()


def _duration_check(text: Any, where: str, errors: dict[str, str]) -> str:
    if not isinstance(text, str) or not WINDOW.match(text.strip()):
        errors[where] = _DURATION_HELP
        return ""
    return text.strip()


def service_level_of(version, policy: str) -> dict:
    """The service level a version sets for its `policy` tier's requests ({} for none)."""
    levels = getattr(version, "approval_service_levels", None) or {}
    return levels.get(policy) or {} if policy in TIERS else {}


def remind_after_of(level: dict) -> timedelta | None:
    return window_of(level["remind_after"]) if level.get("remind_after") else None


def escalate_after_of(level: dict) -> timedelta | None:
    return window_of(level["escalate_after"]) if level.get("escalate_after") else None
