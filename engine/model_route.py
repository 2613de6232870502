"""Where a run's model call goes: its agent's endpoint, or the fallback endpoint the agent names
(docs/EXTENDING.md, "Model endpoints"), and what the model that answered charges and takes in.

**The fallback rule.** Every model call asks the run's own endpoint first. It goes on to the fallback,
in the same model step and at once, when the endpoint fails with a transient error — it cannot be
reached or times out, answers 5xx, 429 or another status a server marks retryable — before it
delivered anything (no text, no tool call, no usage: a stream cut mid-way was already shown and
backs off as before). One exception honours a rate limit first: a 429 that carries Retry-After, unless
the call is itself the retry of a transient failure, backs the run off on its own endpoint
(`waiting / retry_backoff`, at least Retry-After); the retry asks its own endpoint again and goes on
to the fallback if that fails again, 429 or not. When the fallback fails too — transiently, or it refuses the
call — the run backs off as it would without one (one retry counted, the longer Retry-After of the
two honoured), and the next attempt asks its own endpoint first again; after WARDEN_MAX_MODEL_RETRIES
the run fails `model_retries_exhausted`, its error naming both endpoints' last errors. A permanent
error of the run's own endpoint fails the run as before: a fallback is no cure for a bad request.

**Windows.** A run whose models have context windows (EndpointModel.context_window) builds its
context for the smaller of its model's and its fallback model's window — so whichever answers
takes it — less the answer's token limit, and never less than half that window; without one,
WARDEN_CONTEXT_TOKENS. The window is the operator's to set: listing a model with a smaller window
than the vendor's bounds what every call of it sends."""

import logging
from dataclasses import dataclass, field, replace

from runs_app.endpoints import (
    Endpoint,
    ModelTerms,
    endpoint_provider_name,
    run_endpoint,
    run_fallback_endpoint,
    run_model_terms,
)
from runs_app.providers import UnknownProvider, get_provider
from runs_app.providers.base import ModelRequest, PermanentModelError, Provider, Summary, TransientModelError

logger = logging.getLogger("warden.engine")

PRIMARY, FALLBACK = "primary", "fallback"


@dataclass
class Route:
    """The endpoints a run's next model call may go to, read now (a rotated key, a changed price or
    window applies to this call), with the providers that speak to them."""

    provider: Provider
    endpoint: Endpoint | None = None
    fallback: Endpoint | None = None
    fallback_provider: Provider | None = None
    terms: dict[str, ModelTerms] = field(default_factory=dict)

    def window_tokens(self, *, output_limit: int) -> int | None:
        """The token window the call's prompt is built for (the module's rule); None: the setting's."""
        windows = [terms.context_window for role, terms in self.terms.items() if role == PRIMARY or self.fallback]
        if not windows:
            return None
        window = min(windows)
        return max(window - output_limit, window // 2)

    def answered_by(self, role: str, *, input_tokens: int, output_tokens: int) -> dict:
        """What a model step records of the call `role` made: its endpoint, its model, and its cost
        from that model's prices when the server reported usage (null otherwise, or without prices)."""
        endpoint = self.fallback if role == FALLBACK else self.endpoint
        if endpoint is None:
            return {"endpoint": "", "model": "", "cost": None}
        terms = self.terms.get(role)
        cost = (terms.cost(input_tokens=input_tokens, output_tokens=output_tokens)
                if terms is not None and (input_tokens or output_tokens) else None)
        return {"endpoint": endpoint.name[:64], "model": endpoint.model[:100], "cost": cost}

    def fallback_request(self, request: ModelRequest) -> ModelRequest:
        return replace(request, options={**request.options, "model": self.fallback.model})

    def falls_back(self, error: Exception, *, delivered: bool, retrying: bool) -> bool:
        """Whether a call the run's endpoint failed with `error` goes on to the fallback now;
        `retrying`: the run's previous model call failed with a transient error (it backed off)."""
        if self.fallback is None or delivered or not isinstance(error, TransientModelError):
            return False
        # A rate limit with Retry-After is honoured first: the run waits for its own endpoint.
        return not (error.status == 429 and error.retry_after and not retrying)

    def both_failed(self, first: TransientModelError, second: Exception) -> TransientModelError:
        """The error the run backs off with when its endpoint and then its fallback failed."""
        verb = "refused" if isinstance(second, PermanentModelError) else "failed"
        message = (f"endpoint {self.endpoint.name}: {first}; fallback {self.fallback.name} {verb}: {second}")
        waits = [e.retry_after for e in (first, second) if isinstance(e, TransientModelError) and e.retry_after]
        return TransientModelError(message, status=first.status, retry_after=max(waits) if waits else None)

    def summarizer(self) -> Provider:
        """What summarizes an outgrown history: the run's provider, its fallback's when it fails."""
        return self.provider if self.fallback_provider is None else _SummarizerWithFallback(self)


class _SummarizerWithFallback:
    def __init__(self, route: Route):
        self._route = route

    def summarize(self, *, previous: str, messages: list[dict], max_tokens: int) -> Summary:
        try:
            return self._route.provider.summarize(previous=previous, messages=messages, max_tokens=max_tokens)
        except TransientModelError as error:
            logger.warning("summary by endpoint %s failed (%s); asking fallback %s", self._route.endpoint.name, error,
                           self._route.fallback.name)
            return self._route.fallback_provider.summarize(previous=previous, messages=messages, max_tokens=max_tokens)


def route_read(run) -> Route:
    """The run's route as its endpoints stand now. PermanentModelError when its own endpoint cannot
    be called at all; a fallback that cannot (gone, credential unreadable, no provider) is left out,
    logged, and the run calls its own endpoint alone."""
    endpoint = run_endpoint(run)
    if endpoint is None:
        return Route(provider=get_provider(run.provider))
    # The endpoint's kind as it stands now decides the provider (not the run's, fixed when its agent
    # was saved): an endpoint the desk moved to another kind is spoken to in its new protocol.
    try:
        route = Route(provider=get_provider(endpoint_provider_name(endpoint), endpoint=endpoint), endpoint=endpoint)
    except UnknownProvider as error:
        raise PermanentModelError(f"model endpoint {endpoint.name}: {error}") from error
    try:
        fallback = run_fallback_endpoint(run)
        if fallback is not None:
            route.fallback_provider = get_provider(endpoint_provider_name(fallback), endpoint=fallback)
            route.fallback = fallback
    except (PermanentModelError, UnknownProvider) as error:
        logger.warning("run %s: its fallback endpoint cannot be called (%s); calling %s alone", run.id, error,
                       endpoint.name)
    route.terms = run_model_terms(run)
    return route

