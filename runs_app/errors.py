"""The refusals of runs (config/errors.py); why a run failed is RunErrorCode (runs_app.models), stored."""

from config.errors import Refusal


class RunRefusal(Refusal):
    RUN_TERMINAL = "run_terminal", 409  # nothing to cancel: the run ended
    NOT_RETRYABLE = "not_retryable", 409
    NOT_FORKABLE = "not_forkable", 409
    BUDGET_OVER_CAP = "budget_over_cap", 403  # a permission: runs_app.exceed_budget_caps may go above
