"""Single-app rules about runs that write nothing: a request's budgets held to the deployment's caps.
Every write of a run's row, its steps and its tool calls is the state module's (engine/state/)."""

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils import timezone

from config.errors import WardenError
from runs_app.errors import RunRefusal


@dataclass(frozen=True)
class BudgetOverCap:
    """One requested budget above its configured cap."""

    field: str  # as requested: max_model_calls, max_tokens or deadline_seconds
    requested: int
    cap: int
    cap_name: str  # the cap in words: "the cap WARDEN_TOKENS_CAP", "the agent Payout clerk v1's budget_limits cap"


class RunBudgetsOverCap(WardenError):
    """Requested budgets above their caps, each named in `fields`."""

    def __init__(self, over: list[BudgetOverCap]):
        self.over = over
        super().__init__(
            RunRefusal.BUDGET_OVER_CAP,
            "; ".join(f"budgets.{o.field} may be at most {o.cap} ({o.cap_name}), not {o.requested}" for o in over)
            + ". Going above a cap needs the runs_app.exceed_budget_caps permission.",
            fields=[{"field": f"body.budgets.{o.field}", "type": RunRefusal.BUDGET_OVER_CAP.value,
                     "message": f"at most {o.cap} ({o.cap_name}) without the runs_app.exceed_budget_caps permission"}
                    for o in over],
        )


def run_budgets_over_caps(*, budgets: dict[str, Any], agent_version=None) -> list[BudgetOverCap]:
    """Which of a request's budgets (max_model_calls, max_tokens, deadline_seconds — or an
    absolute `deadline`) exceed the deployment's caps, or the agent version's own maxima (its
    `budget_limits`) where those are lower; empty when none does."""
    requested = {key: budgets.get(key) for key in ("max_model_calls", "max_tokens", "deadline_seconds")}
    if requested["deadline_seconds"] is None and budgets.get("deadline") is not None:
        requested["deadline_seconds"] = int((budgets["deadline"] - timezone.now()).total_seconds())
    caps = {
        "max_model_calls": (settings.WARDEN_MODEL_CALLS_CAP, "the cap WARDEN_MODEL_CALLS_CAP"),
        "max_tokens": (settings.WARDEN_TOKENS_CAP, "the cap WARDEN_TOKENS_CAP"),
        "deadline_seconds": (settings.WARDEN_DEADLINE_CAP_SECONDS, "the cap WARDEN_DEADLINE_CAP_SECONDS"),
    }
    for field, limit in ((agent_version.budget_limits or {}) if agent_version is not None else {}).items():
        if field in caps and limit < caps[field][0]:
            caps[field] = (limit, f"the agent {agent_version.name} v{agent_version.number}'s budget_limits cap")
    return [
        BudgetOverCap(field=field, requested=value, cap=caps[field][0], cap_name=caps[field][1])
        for field, value in requested.items()
        if value is not None and value > caps[field][0]
    ]
