"""The refusals of runs (config/errors.py); why a run failed is RunErrorCode (runs_app.models), stored."""

from config.errors import Refusal


class RunRefusal(Refusal):
    RUN_TERMINAL = "run_terminal", 409  # nothing to cancel: the run ended
    NOT_RETRYABLE = "not_retryable", 409
    NOT_FORKABLE = "not_forkable", 409
    BUDGET_OVER_CAP = "budget_over_cap", 403  # a permission: runs_app.exceed_budget_caps may go above


class EndpointRefusal(Refusal):
    """The refusals of a model endpoint's definition (engine.actions.endpoints)."""

    INVALID_ENDPOINT = "invalid_endpoint", 422  # a definition refused field by field; nothing saved
    ENDPOINT_NAME_TAKEN = "endpoint_name_taken", 409
    MODEL_IN_USE = "model_in_use", 409  # an agent's current version names it: point the agent elsewhere first
