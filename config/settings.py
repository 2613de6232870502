"""Warden settings. Everything deployment-specific comes from environment variables,
each documented where it is read."""

import json
import os
from urllib.parse import urlsplit
import re
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def _env_rate(name: str, default: str) -> str:
    """A rate limit, `count/period` with period s, min, hour or day (django-ninja's format)."""
    value = os.environ.get(name, default).strip()
    if not re.fullmatch(r"[1-9][0-9]*/(s|sec|m|min|h|hour|d|day)", value):
        raise ImproperlyConfigured(f"{name} must look like 60/min (count/s|min|hour|day), not {value!r}.")
    return value


# DEBUG: Django's debug mode; off unless set to 1/true.
DEBUG = _env_bool("DEBUG", False)
# WARDEN_DEMO: demo mode (the demo agent, tools, data and simulated payment service); default off.
WARDEN_DEMO = _env_bool("WARDEN_DEMO", False)
# SECRET_KEY: signs sessions, CSRF tokens and password resets; required (at least 50 random
# characters) unless DEBUG or WARDEN_DEMO is on, where a development key stands in.
DEVELOPMENT_SECRET_KEY = "warden-insecure-development-key-change-me"
SECRET_KEY = os.environ.get("SECRET_KEY") or DEVELOPMENT_SECRET_KEY
if SECRET_KEY == DEVELOPMENT_SECRET_KEY and not (DEBUG or WARDEN_DEMO):
    raise ImproperlyConfigured(
        "SECRET_KEY is not set, and Warden will not run with its development key outside DEBUG or demo mode. "
        "Set SECRET_KEY to a long random value, e.g. "
        "`python -c 'import secrets; print(secrets.token_urlsafe(50))'` (docs/DEPLOYMENT.md), "
        "or set WARDEN_DEMO=1 to run the demo."
    )
# ALLOWED_HOSTS: comma-separated host names this server answers to; default local only.
ALLOWED_HOSTS = _env_list("ALLOWED_HOSTS", "127.0.0.1,localhost")
# CSRF_TRUSTED_ORIGINS: comma-separated origins (scheme://host[:port]) trusted to POST with cookies
# and to open the console's websocket (config/security.py); default the local server.
CSRF_TRUSTED_ORIGINS = _env_list("CSRF_TRUSTED_ORIGINS", "http://127.0.0.1:8000,http://localhost:8000")

INSTALLED_APPS = [
    "daphne",  # must precede staticfiles so `runserver` is the ASGI one
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "channels_postgres",
    "django_q",
    "ninja",  # the API docs page uses ninja's bundled Swagger UI, not a CDN (PITFALLS.md)
    "axes",
    # The domain, bottom up (docs/ARCHITECTURE.md, "Layers").
    "runs_app",
    "tools_app",
    "agents",
    "sessions_app",
    "approvals_app",
    "notifications",
    "operations",
    # The interfaces: the operators' desk (the admin), the customers' console, the commands.
    "desk",
    "console",
    "cli",
    # The demo world (simulated orders, refunds and faults) exists only in demo mode.
    *(["demo"] if WARDEN_DEMO else []),
]

MIDDLEWARE = [
    # First: every answer, even a refusal below, names its request (X-Request-ID), as its log lines do.
    "config.request_ids.RequestIdMiddleware",
    # Then: a caller over their share of the database connections is answered before taking one.
    "config.fair_share.FairShareMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "config.security.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: turns a login refused during a lockout into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "server.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "server.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# DATABASE_URL: the PostgreSQL server to use (postgres://user:pass@host:port/name).
# Unset: an embedded PostgreSQL server is started in .warden/pgdata (config/embedded_db.py).
DATABASE_URL = os.environ.get("DATABASE_URL")
WARDEN_EMBEDDED_DB = not DATABASE_URL
if WARDEN_EMBEDDED_DB:
    from config.embedded_db import embedded_database_url

    DATABASE_URL = embedded_database_url(BASE_DIR)
    # Child processes (workers started by `make run` or by tests) reuse the same server.
    os.environ["DATABASE_URL"] = DATABASE_URL
if not DATABASE_URL.startswith(("postgres://", "postgresql://")):
    raise RuntimeError("Warden runs on PostgreSQL only; DATABASE_URL must be a postgres:// URL.")
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
DATABASES["default"]["TEST"] = {"NAME": os.environ.get("WARDEN_TEST_DATABASE_NAME") or None}
# The lease keeper's own connection in a worker process (engine/lease.py): the same database, never
# from the pool the process's runs share, so a busy pool cannot delay a renewal past the lease.
DATABASES["leases"] = {**DATABASES["default"], "TEST": {"MIRROR": "default"}}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# REDIS_URL: optional Redis server (redis://host:port/db). When set, the Channels layer uses
# Redis; otherwise live delivery goes through PostgreSQL, so no extra service is needed.
REDIS_URL = os.environ.get("REDIS_URL") or None

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # channels_redis's pub/sub layer with confirmed subscriptions (config/channel_layers.py).
            "BACKEND": "config.channel_layers.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    _db = DATABASES["default"]
    CHANNEL_LAYERS = {
        "default": {
            # channels_postgres with its listener races closed and a one-statement group_send
            # (config/channel_layers.py).
            "BACKEND": "config.channel_layers.PostgresChannelLayer",
            # TIME_ZONE: the layer builds a Django DatabaseWrapper from this dict, which needs the key
            # (Django only fills it in DATABASES after setup); without it get_channel_layer() is None.
            # PSYCOPG_OPTIONS: the layer's pool opens one connection, not four, in every process
            # that publishes (each worker), and grows on demand.
            "CONFIG": {
                **{key: _db[key] for key in ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT")},
                "TIME_ZONE": None,
                "PSYCOPG_OPTIONS": {"min_size": 1, "max_size": 4},
                # A doorbell need not survive a crash (RunEvent is the truth), so its INSERT does
                # not wait for the WAL flush: one fsync less per text delta.
                "OPTIONS": {"options": "-c synchronous_commit=off"},
            },
        }
    }
    # The layer's group_discard goes through the ORM on this alias (same database; tests mirror
    # default). Without it every disconnect fails and leaves its channel in the group for good.
    DATABASES["channels_postgres"] = {**_db, "TEST": {"MIRROR": "default"}}

# CACHES: "default" is shared by every process, so a rate limit counts the requests of all of
# them: Redis when REDIS_URL is set, otherwise a PostgreSQL table (sessions_app migration 0006).
# WARDEN_CACHE_PREFIX: the prefix of this deployment's keys there (one Redis may serve several); default warden.
_cache_prefix = os.environ.get("WARDEN_CACHE_PREFIX", "warden")
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
                          "KEY_PREFIX": _cache_prefix}}
else:
    # Django culls a database cache at 300 keys by default, which would forget rate-limit counts
    # once ~100 users are active; expired keys are culled instead, and a third of the table only
    # past WARDEN_CACHE_MAX_ENTRIES (default 1,000,000).
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "warden_cache",
                          "KEY_PREFIX": _cache_prefix,
                          "OPTIONS": {"MAX_ENTRIES": _env_int("WARDEN_CACHE_MAX_ENTRIES", 1_000_000), "CULL_FREQUENCY": 3}}}
# Per process: django-q2's cluster statistics, which it would otherwise write twice a second.
CACHES["local"] = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

# ---------------------------------------------------------------------------
# Logins and rate limits (docs/SECURITY.md)
# ---------------------------------------------------------------------------
# django-axes watches every login (console and admin); its state lives in PostgreSQL, so every
# web process sees the same failures. The first backend refuses a locked-out login outright.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
# Failures count per username and, separately, per client address: either reaching the limit locks.
# The client address is REMOTE_ADDR; behind a proxy, run daphne with --proxy-headers.
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
# WARDEN_LOGIN_FAILURE_LIMIT: failed logins (per username, and per address) that lock logins; default 10.
AXES_FAILURE_LIMIT = _env_int("WARDEN_LOGIN_FAILURE_LIMIT", 10)
# WARDEN_LOGIN_LOCKOUT_SECONDS: how long a lockout lasts after the last attempt (every attempt
# during a lockout, even with the right password, starts it again); default 900.
AXES_COOLOFF_TIME = timedelta(seconds=_env_int("WARDEN_LOGIN_LOCKOUT_SECONDS", 900))
AXES_RESET_ON_SUCCESS = True
# The lockout page says for how long (console/views.py), on both logins.
AXES_LOCKOUT_CALLABLE = "console.views.login_locked_out"

# API rate limits (config/throttling.py): each a sliding window `count/period` (s, min, hour, day)
# on the shared cache; over it, 429 {"code": "throttled"} with Retry-After.
# WARDEN_API_RATE_PER_KEY: requests one API key may make; default 300/min.
WARDEN_API_RATE_PER_KEY = _env_rate("WARDEN_API_RATE_PER_KEY", "300/min")
# WARDEN_API_RATE_PER_USER: requests one user may make, all their keys and their browser together; default 600/min.
WARDEN_API_RATE_PER_USER = _env_rate("WARDEN_API_RATE_PER_USER", "600/min")
# WARDEN_API_WRITE_RATE_PER_USER: POSTs (new sessions, messages that start runs, cancels,
# decisions) one user may make; default 60/min.
WARDEN_API_WRITE_RATE_PER_USER = _env_rate("WARDEN_API_WRITE_RATE_PER_USER", "60/min")

# ---------------------------------------------------------------------------
# HTTPS and browser hardening (the production profile: docs/DEPLOYMENT.md)
# ---------------------------------------------------------------------------
# WARDEN_HTTPS: the site is reached over HTTPS only (directly or through a TLS-terminating proxy):
# cookies are Secure, plain HTTP is redirected to HTTPS and HSTS is sent; default off.
WARDEN_HTTPS = _env_bool("WARDEN_HTTPS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE_SSL_REDIRECT = WARDEN_HTTPS
# WARDEN_PROXY_SSL_HEADER: the header a TLS-terminating proxy sets to `https` (e.g. X-Forwarded-Proto);
# only for a proxy that always sets or strips it, or a client could claim HTTPS; default none.
_proxy_ssl_header = os.environ.get("WARDEN_PROXY_SSL_HEADER", "").strip()
if _proxy_ssl_header:
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https")
# SECURE_HSTS_SECONDS: how long browsers must use HTTPS only; default a year with WARDEN_HTTPS, else 0.
SECURE_HSTS_SECONDS = _env_int("SECURE_HSTS_SECONDS", 31_536_000 if WARDEN_HTTPS else 0)
# SECURE_HSTS_INCLUDE_SUBDOMAINS / SECURE_HSTS_PRELOAD: HSTS for every subdomain too / allow
# submission to browsers' preload list; default on with WARDEN_HTTPS (turn off if a subdomain has no HTTPS).
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", WARDEN_HTTPS)
SECURE_HSTS_PRELOAD = _env_bool("SECURE_HSTS_PRELOAD", WARDEN_HTTPS)
# WARDEN_CONTENT_SECURITY_POLICY: the Content-Security-Policy of every page (config/security.py);
# default: scripts, styles, images, fonts and connections (the console's websocket included) from
# this origin only — no inline script or style, no CDN, no framing.
CONTENT_SECURITY_POLICY = os.environ.get(
    "WARDEN_CONTENT_SECURITY_POLICY",
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'",
)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

LOGIN_URL = "/admin/login/"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    # WARDEN_LOG_LEVEL: level for Warden's own loggers; default INFO.
    "loggers": {
        "warden": {"handlers": ["console"], "level": os.environ.get("WARDEN_LOG_LEVEL", "INFO")},
        "django_q": {"handlers": ["console"], "level": os.environ.get("WARDEN_Q_LOG_LEVEL", "WARNING")},
        # It warns on every publish to a session nobody is watching, which is the normal case.
        "channels_postgres": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}

# ---------------------------------------------------------------------------
# The run engine
# ---------------------------------------------------------------------------
# WARDEN_LEASE_SECONDS: how long a worker's claim on a run lasts without a heartbeat; default 30.
WARDEN_LEASE_SECONDS = float(os.environ.get("WARDEN_LEASE_SECONDS", 30))
# WARDEN_HEARTBEAT_SECONDS: how often a working worker extends its lease; default lease/3.
WARDEN_HEARTBEAT_SECONDS = float(os.environ.get("WARDEN_HEARTBEAT_SECONDS", WARDEN_LEASE_SECONDS / 3))
# WARDEN_SLICE_SECONDS: how long one task drives a run before yielding it back to the queue; default 40.
WARDEN_SLICE_SECONDS = float(os.environ.get("WARDEN_SLICE_SECONDS", 40))
# WARDEN_CANCEL_POLL_SECONDS: how often a worker process looks for cancel requests of the runs it
# drives (one query for all of them), closing a cancelled run's model call at once; default 0.5.
WARDEN_CANCEL_POLL_SECONDS = float(os.environ.get("WARDEN_CANCEL_POLL_SECONDS", 0.5))
# WARDEN_MODEL_CONCURRENCY_PER_ENDPOINT: model calls one process has in flight to one model server at
# once; more wait for a free slot (within the call's timeout): a slow endpoint cannot take every
# run's thread; default WARDEN_RUNS_PER_WORKER.
WARDEN_MODEL_CONCURRENCY_PER_ENDPOINT = max(1, _env_int("WARDEN_MODEL_CONCURRENCY_PER_ENDPOINT",
                                                         _env_int("WARDEN_RUNS_PER_WORKER", 100)))
# WARDEN_CUSTOMER_MAX_RUNNING: runs of one customer (a session's owner) running at once across all
# workers; a run over it stays queued until one of theirs stops running; default 0 (no limit).
WARDEN_CUSTOMER_MAX_RUNNING = max(0, _env_int("WARDEN_CUSTOMER_MAX_RUNNING", 0))
# WARDEN_SWEEP_SECONDS: how often the sweeper looks for expired leases, due backoffs and approvals; default 5.
WARDEN_SWEEP_SECONDS = float(os.environ.get("WARDEN_SWEEP_SECONDS", 5))
# WARDEN_MAX_MODEL_CALLS: default budget of model calls per run; default 20.
WARDEN_MAX_MODEL_CALLS = _env_int("WARDEN_MAX_MODEL_CALLS", 20)
# WARDEN_MAX_TOKENS: default budget of total tokens per run; default 200000.
WARDEN_MAX_TOKENS = _env_int("WARDEN_MAX_TOKENS", 200_000)
# WARDEN_RUN_DEADLINE_SECONDS: default wall-clock limit of a run from its creation; default 3600.
WARDEN_RUN_DEADLINE_SECONDS = _env_int("WARDEN_RUN_DEADLINE_SECONDS", 3600)
# WARDEN_MODEL_MAX_OUTPUT_TOKENS: the output token limit a model call asks for (max_tokens); a run's
# provider option `max_tokens` overrides it; default 1024.
WARDEN_MODEL_MAX_OUTPUT_TOKENS = _env_int("WARDEN_MODEL_MAX_OUTPUT_TOKENS", 1024)
# WARDEN_MODEL_MAX_OUTPUT_TOKENS_CEILING: after a length cut the limit doubles up to this; a cut at
# it fails the run (model_output_truncated); default 8192.
WARDEN_MODEL_MAX_OUTPUT_TOKENS_CEILING = _env_int("WARDEN_MODEL_MAX_OUTPUT_TOKENS_CEILING", 8192)
# WARDEN_MAX_INVALID_OUTPUTS: model outputs rejected in a row (truncated, malformed) before the run
# fails; from the second one on, each waits a growing backoff first; default 3.
WARDEN_MAX_INVALID_OUTPUTS = _env_int("WARDEN_MAX_INVALID_OUTPUTS", 3)
# Caps on the budgets a request may ask for (POST /sessions/{id}/messages `budgets`); above one the
# request is refused (422) unless the caller has the runs_app.exceed_budget_caps permission.
# WARDEN_MODEL_CALLS_CAP: the most model calls a request may give its run; default 50 (at least the default budget).
WARDEN_MODEL_CALLS_CAP = _env_int("WARDEN_MODEL_CALLS_CAP", max(50, WARDEN_MAX_MODEL_CALLS))
# WARDEN_TOKENS_CAP: the most tokens a request may give its run; default 500000 (at least the default budget).
WARDEN_TOKENS_CAP = _env_int("WARDEN_TOKENS_CAP", max(500_000, WARDEN_MAX_TOKENS))
# WARDEN_DEADLINE_CAP_SECONDS: the longest deadline a request may give its run; default 14400 (4 h; at least the default).
WARDEN_DEADLINE_CAP_SECONDS = _env_int("WARDEN_DEADLINE_CAP_SECONDS", max(14_400, WARDEN_RUN_DEADLINE_SECONDS))
# WARDEN_MAX_MODEL_RETRIES: transient model errors tolerated per run before it fails; default 5.
WARDEN_MAX_MODEL_RETRIES = _env_int("WARDEN_MAX_MODEL_RETRIES", 5)
# WARDEN_RETRY_BASE_SECONDS: first backoff after a transient model error (doubles, with jitter); default 1.
WARDEN_RETRY_BASE_SECONDS = float(os.environ.get("WARDEN_RETRY_BASE_SECONDS", 1))
# WARDEN_INPUT_TTL_SECONDS: how long a run waits for the user to answer its question; default 3600.
WARDEN_INPUT_TTL_SECONDS = _env_int("WARDEN_INPUT_TTL_SECONDS", 3600)
# WARDEN_RETENTION_DAYS: sessions idle this many days are erased by `manage.py erase_sessions`
# (archived first); unset: kept until someone runs it with --older-than or --user.
WARDEN_RETENTION_DAYS = int(os.environ["WARDEN_RETENTION_DAYS"]) if os.environ.get("WARDEN_RETENTION_DAYS") else None
# WARDEN_IDEMPOTENCY_KEY_TTL_SECONDS: how long an API Idempotency-Key and its response are kept; default 86400.
WARDEN_IDEMPOTENCY_KEY_TTL_SECONDS = _env_int("WARDEN_IDEMPOTENCY_KEY_TTL_SECONDS", 86_400)
# WARDEN_WRITES_PER_TURN / WARDEN_WRITES_PER_RUN: how many writes one model turn and one run may make
# when the agent's definition says nothing (its `write_caps`); more are refused before anything runs.
WARDEN_WRITES_PER_TURN = _env_int("WARDEN_WRITES_PER_TURN", 1)
WARDEN_WRITES_PER_RUN = _env_int("WARDEN_WRITES_PER_RUN", 5)
# WARDEN_APPROVAL_TTL_SECONDS: how long an approval request stays open; default 86400 (a day).
WARDEN_APPROVAL_TTL_SECONDS = _env_int("WARDEN_APPROVAL_TTL_SECONDS", 86_400)
# WARDEN_APPROVAL_LINK_TTL_SECONDS: how long a decision link in a notification stays usable (never
# past its request's expiry); default 86400 (a day). docs/NOTIFICATIONS.md.
WARDEN_APPROVAL_LINK_TTL_SECONDS = _env_int("WARDEN_APPROVAL_LINK_TTL_SECONDS", 86_400)
# WARDEN_CONTEXT_TOKENS: token window of the model context built from history, for runs whose model has no
# context window of its own (an endpoint's models do: engine/model_route.py); default 8000.
WARDEN_CONTEXT_TOKENS = _env_int("WARDEN_CONTEXT_TOKENS", 8000)
# WARDEN_RECONCILE_GRACE_SECONDS: how long after an ambiguous write a "not found downstream"
# answer is still treated as "maybe not booked yet" rather than "not applied"; default 30.
WARDEN_RECONCILE_GRACE_SECONDS = float(os.environ.get("WARDEN_RECONCILE_GRACE_SECONDS", 30))
# WARDEN_FOUR_EYES: forbid operators from deciding approvals, or reconciling tool calls, of their own sessions; default on.
WARDEN_FOUR_EYES = _env_bool("WARDEN_FOUR_EYES", True)
# WARDEN_STREAMS_PER_USER: live connections one user may hold open at once — SSE event streams and
# console websockets together, over every web process (operations/streams.py); beyond it 429; default 20.
WARDEN_STREAMS_PER_USER = _env_int("WARDEN_STREAMS_PER_USER", 20)
# WARDEN_CONSOLE_RECHECK_SECONDS: how often an open console socket checks its user may still
# see what it watches (logged out, deactivated, permission lost).
WARDEN_CONSOLE_RECHECK_SECONDS = float(os.environ.get("WARDEN_CONSOLE_RECHECK_SECONDS", 30))

# WARDEN_TOKEN_PRICE_PER_MILLION: what a million model tokens cost, in WARDEN_COST_CURRENCY; the desk
# shows runs' cost as tokens × this price (an estimate: one price for prompt and answer); default 0.60.
WARDEN_TOKEN_PRICE_PER_MILLION = float(os.environ.get("WARDEN_TOKEN_PRICE_PER_MILLION", 0.60))
# WARDEN_COST_CURRENCY: the currency of that price; default USD.
WARDEN_COST_CURRENCY = os.environ.get("WARDEN_COST_CURRENCY", "USD")
# WARDEN_DESK_REFRESH_SECONDS: how often the desk's queues and dashboard reload themselves while
# nobody is working on the page (0: never); default 30.
WARDEN_DESK_REFRESH_SECONDS = _env_int("WARDEN_DESK_REFRESH_SECONDS", 30)

# WARDEN_TOOL_MODULES: comma-separated dotted paths of the modules that register the deployment's
# tools (imported at start-up; one that cannot be stops it, in one line naming it); default none.
# Demo mode keeps the demo world's tools whatever this adds (issue 28).
WARDEN_TOOL_MODULES = [
    m.strip() for m in os.environ.get("WARDEN_TOOL_MODULES", "").split(",") if m.strip()
]
if WARDEN_DEMO and "demo.tools" not in WARDEN_TOOL_MODULES:
    WARDEN_TOOL_MODULES.insert(0, "demo.tools")
if not WARDEN_DEMO and any(m == "demo" or m.startswith("demo.") for m in WARDEN_TOOL_MODULES):
    raise RuntimeError("WARDEN_TOOL_MODULES names the demo world's tools, which exist only in demo mode: set WARDEN_DEMO=1 or remove them.")
# WARDEN_MCP_STDIO: whether an MCP server may be a local command over stdio (a process Warden starts
# for each call, with the credential as its environment); off by default: a deployment that allows it
# lets whoever may define MCP servers run commands on its workers (docs/EXTENDING.md, "MCP servers").
WARDEN_MCP_STDIO = _env_bool("WARDEN_MCP_STDIO", False)
# Model providers by name: the class (dotted path) implementing runs_app.providers.base.Provider.
# WARDEN_PROVIDER_CLASSES: comma-separated `name=dotted.path.Class` pairs a deployment adds (or
# overrides) beside the built-in ones — scripted, openai (Chat Completions), openai-responses and
# anthropic (Messages), the last three the providers of those kinds of model endpoint; default none.
WARDEN_PROVIDERS = {
    # In demo mode the scripted model knows the demo world (demo/model.py); otherwise it follows scripts.
    "scripted": "demo.model.DemoModel" if WARDEN_DEMO else "runs_app.providers.scripted.ScriptedProvider",
    "openai": "runs_app.providers.openai.OpenAIProvider",
    "openai-responses": "runs_app.providers.responses.ResponsesProvider",
    "anthropic": "runs_app.providers.anthropic.AnthropicProvider",
    **dict(pair.split("=", 1) for pair in _env_list("WARDEN_PROVIDER_CLASSES", "") if "=" in pair),
}
# WARDEN_DEFAULT_AGENT: the slug of the agent a new session gets when it names none (API, console);
# default none — in demo mode the demo agent, "refund-desk-demo" (created by `manage.py demo_setup`).
# A session without an agent offers every registered tool, each with its own approval policy.
WARDEN_DEFAULT_AGENT = os.environ.get("WARDEN_DEFAULT_AGENT", "refund-desk-demo" if WARDEN_DEMO else "").strip()
# WARDEN_MODEL_PROVIDER: `scripted` (deterministic, no network; the default) or `openai`.
WARDEN_MODEL_PROVIDER = os.environ.get("WARDEN_MODEL_PROVIDER", "scripted")
# WARDEN_SCRIPTED_DELAY_SECONDS: pause between streamed chunks of the scripted model; default 0.02.
WARDEN_SCRIPTED_DELAY_SECONDS = float(os.environ.get("WARDEN_SCRIPTED_DELAY_SECONDS", 0.02))
# OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL: any OpenAI-compatible Chat Completions server.
OPENAI_BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")
OPENAI_API_KEY = os.environ.get("OPENAI_API_KEY", "not-needed")
OPENAI_MODEL = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
# OPENAI_TIMEOUT_SECONDS: per-request timeout of the OpenAI-compatible client; default 60.
OPENAI_TIMEOUT_SECONDS = float(os.environ.get("OPENAI_TIMEOUT_SECONDS", 60))

# WARDEN_SIM_BASE_URL: where the demo tools reach the simulated order/payment service (demo mode);
# default the simulator's own daphne that `manage.py serve_all` starts on the web port + 1.
WARDEN_SIM_BASE_URL = os.environ.get("WARDEN_SIM_BASE_URL", "http://127.0.0.1:8001/sim")

# WARDEN_FAULT_POINTS: test-only; comma-separated `point=action` pairs (action: die, pause:SECONDS)
# that make a worker stop at a named dangerous moment. Ignored unless WARDEN_ALLOW_FAULTS is set.
WARDEN_ALLOW_FAULTS = _env_bool("WARDEN_ALLOW_FAULTS", False)
WARDEN_FAULT_POINTS = os.environ.get("WARDEN_FAULT_POINTS", "")

# django-q2: the queue only delivers; the run's lease decides who works (PITFALLS.md).
# It never retries on its own (max_attempts=1, ack_failures), and a task's timeout stays below
# `retry` so the broker never hands a live task out twice.
Q_CLUSTER = {
    "name": "warden",
    # WARDEN_WORKERS: worker processes per cluster; default 2.
    "workers": _env_int("WARDEN_WORKERS", 2),
    "orm": "default",
    # A task yields its run after WARDEN_SLICE_SECONDS, but only between steps: a long model
    # stream or tool call may overrun the slice, so the hard timeout leaves room for it.
    # WARDEN_TASK_TIMEOUT_SECONDS: django-q2's hard kill of a task; default 300.
    "timeout": _env_int("WARDEN_TASK_TIMEOUT_SECONDS", 300),
    "retry": _env_int("WARDEN_TASK_TIMEOUT_SECONDS", 300) + 60,
    "max_attempts": 1,
    "ack_failures": True,
    "catch_up": False,
    "save_limit": 200,
    # WARDEN_Q_POLL: seconds between broker polls when the doorbell is off (with it, the shortest
    # wait between two looks at the queue without a bell); default 0.05.
    "poll": float(os.environ.get("WARDEN_Q_POLL", 0.05)),
    # WARDEN_Q_BULK: tasks the cluster takes from the broker in one claim; default 1.
    "bulk": max(1, _env_int("WARDEN_Q_BULK", 1)),
    # Tasks before a worker process is replaced; a task is one slice of one run, and a process
    # drives WARDEN_RUNS_PER_WORKER of them at once.
    "recycle": 500 * max(1, _env_int("WARDEN_RUNS_PER_WORKER", 100)),
    "label": "Task queue",
    "cache": "local",
}
if REDIS_URL and _env_bool("WARDEN_REDIS_BROKER", False):
    # WARDEN_REDIS_BROKER: use Redis as the task broker instead of the ORM; default off.
    Q_CLUSTER.pop("orm")
    Q_CLUSTER["redis"] = REDIS_URL
# WARDEN_Q_DOORBELL: the ORM broker rings a PostgreSQL NOTIFY with every task it queues, and an
# idle cluster waits for it on a LISTEN connection instead of polling (engine/broker.py); default on.
WARDEN_Q_DOORBELL = _env_bool("WARDEN_Q_DOORBELL", True)
# WARDEN_Q_FALLBACK_POLL_SECONDS: with the doorbell, how often an idle cluster looks at the queue
# anyway, for what rings no bell (a claim that ran out is looked for when it falls due); default 5.
WARDEN_Q_FALLBACK_POLL_SECONDS = float(os.environ.get("WARDEN_Q_FALLBACK_POLL_SECONDS", 5))
if WARDEN_Q_DOORBELL and "orm" in Q_CLUSTER:
    Q_CLUSTER["broker_class"] = "engine.broker.DoorbellBroker"

# ---------------------------------------------------------------------------
# Operating it (SPEC §17; docs/OPERATIONS.md): connections, logs, health, metrics, tracing,
# webhooks. Kept in one block: it adjusts DATABASES and LOGGING defined above.
# ---------------------------------------------------------------------------
# WARDEN_DB_CONN_MAX_AGE: seconds a process keeps a database connection for reuse (Django's
# persistent connections, checked before reuse); 0 opens one per request; default 60.
WARDEN_DB_CONN_MAX_AGE = _env_int("WARDEN_DB_CONN_MAX_AGE", 60)
# WARDEN_DB_CONNECT_TIMEOUT: seconds to wait for a new database connection; default 5.
WARDEN_DB_CONNECT_TIMEOUT = _env_int("WARDEN_DB_CONNECT_TIMEOUT", 5)
# WARDEN_RUNS_PER_WORKER: runs one worker process drives at once, each in a thread of its own,
# while the others wait on their model calls (engine/executor.py); default 100; 1 drives one run
# at a time in the process's main thread, as before issue 34.
WARDEN_RUNS_PER_WORKER = max(1, _env_int("WARDEN_RUNS_PER_WORKER", 100))
# WARDEN_WORKER_DB_POOL_SIZE: database connections one worker process holds at most (psycopg's pool,
# shared by its runs, which give theirs back while they wait on a model or a tool; a worker process
# switches to it on its first run, engine/executor.py); default 8.
WARDEN_WORKER_DB_POOL_SIZE = max(2, _env_int("WARDEN_WORKER_DB_POOL_SIZE", 8))
# WARDEN_SLOT_WAIT_SECONDS: how long a worker process whose runs fill every slot holds a task for
# another run before handing it back to the queue, where a process with a free slot takes it
# (engine/executor.py); default 0.5.
WARDEN_SLOT_WAIT_SECONDS = max(0.05, float(os.environ.get("WARDEN_SLOT_WAIT_SECONDS", 0.5)))
# WARDEN_DB_POOL_SIZE: web server processes (server/asgi.py marks them) use psycopg's connection
# pool of at most this many connections instead: under ASGI every request runs in a thread of its
# own, so a persistent connection would never be reused there; default 10; 0 turns the pool off.
# Sweepers and commands keep persistent connections; a worker process that drives many runs makes
# its own pool once forked (WARDEN_WORKER_DB_POOL_SIZE above: a pool must not cross a fork).
WARDEN_DB_POOL_SIZE = _env_int("WARDEN_DB_POOL_SIZE", 10) if os.environ.get("WARDEN_WEB_SERVER") == "1" else 0
for _alias in DATABASES.values():
    _alias["CONN_MAX_AGE"] = 0 if WARDEN_DB_POOL_SIZE else WARDEN_DB_CONN_MAX_AGE
    _alias["CONN_HEALTH_CHECKS"] = True
    _alias.setdefault("OPTIONS", {})["connect_timeout"] = WARDEN_DB_CONNECT_TIMEOUT
    if WARDEN_DB_POOL_SIZE:
        # A request waits at most `timeout` seconds for a free connection; idle ones close after a minute.
        _alias["OPTIONS"]["pool"] = {"min_size": 1, "max_size": WARDEN_DB_POOL_SIZE, "timeout": 10, "max_idle": 60}
# WARDEN_DB_FAIR_SHARE: requests one caller (API key, browser session, else address) may have in
# progress in one web process at once (config/fair_share.py); default half of WARDEN_DB_POOL_SIZE;
# 0 (and always without a pool) turns it off.
WARDEN_DB_FAIR_SHARE = (_env_int("WARDEN_DB_FAIR_SHARE", max(1, WARDEN_DB_POOL_SIZE // 2)) if WARDEN_DB_POOL_SIZE else 0)
# WARDEN_SESSION_TURN_WAIT: seconds a request's write to a session waits for the same process's other
# writes to that session (without a database connection, config/fair_share.session_turn) before it
# is answered 503 try_again; default 30.
WARDEN_SESSION_TURN_WAIT = float(os.environ.get("WARDEN_SESSION_TURN_WAIT", "30"))

# WARDEN_LOG_FORMAT: `json` (one JSON object a line, with run_id, session_id, tool_call_id and
# lease_token when known) or `plain` (for development); default json.
WARDEN_LOG_FORMAT = os.environ.get("WARDEN_LOG_FORMAT", "json").strip().lower()
LOGGING["filters"] = {"run_context": {"()": "config.logs.RunContextFilter"}}
LOGGING["formatters"]["json"] = {"()": "config.logs.JsonFormatter"}
LOGGING["formatters"]["plain"] = {"format": "%(asctime)s %(levelname)s %(name)s %(process)d %(run_context)s%(message)s"}
LOGGING["handlers"]["console"] |= {"formatter": "json" if WARDEN_LOG_FORMAT == "json" else "plain", "filters": ["run_context"]}
# django-q2 logs as "django-q" (with a hyphen); configured here, it keeps no plain handler of its own.
LOGGING["loggers"]["django-q"] = {**LOGGING["loggers"]["django_q"], "propagate": False}

# django-prometheus: request and response metrics of each web process, beside Warden's own
# (operations/metrics.py), all at /metrics.
INSTALLED_APPS += ["django_prometheus"]
MIDDLEWARE = ["django_prometheus.middleware.PrometheusBeforeMiddleware", *MIDDLEWARE,
              "django_prometheus.middleware.PrometheusAfterMiddleware"]

# WARDEN_WORKER_HEARTBEAT_SECONDS: how often each worker, sweeper and web process records its
# heartbeat row (and its counters) in PostgreSQL; default 5.
WARDEN_WORKER_HEARTBEAT_SECONDS = float(os.environ.get("WARDEN_WORKER_HEARTBEAT_SECONDS", 5))
# WARDEN_WORKER_STALE_SECONDS: /readyz wants a worker heartbeat younger than this; default 30.
WARDEN_WORKER_STALE_SECONDS = float(os.environ.get("WARDEN_WORKER_STALE_SECONDS", 30))
# WARDEN_SWEEPER_STALE_SECONDS: /readyz wants a sweep younger than this; default 150 (the
# django-q2 schedule sweeps every minute where no `sweep --loop` runs).
WARDEN_SWEEPER_STALE_SECONDS = float(os.environ.get("WARDEN_SWEEPER_STALE_SECONDS", 150))

# WARDEN_METRICS_TOKEN: bearer token /metrics requires (`Authorization: Bearer …`); unset, only
# WARDEN_METRICS_ALLOWED_IPS may scrape.
WARDEN_METRICS_TOKEN = os.environ.get("WARDEN_METRICS_TOKEN") or None
# WARDEN_METRICS_ALLOWED_IPS: comma-separated client addresses that may scrape /metrics without
# the token; default the loopback addresses.
WARDEN_METRICS_ALLOWED_IPS = [a.strip() for a in os.environ.get("WARDEN_METRICS_ALLOWED_IPS", "127.0.0.1,::1").split(",") if a.strip()]
# WARDEN_METRICS_CACHE_SECONDS: a process answers scrapes from one PostgreSQL reading for this
# long, so many scrapers cost one set of queries; default 5.
WARDEN_METRICS_CACHE_SECONDS = float(os.environ.get("WARDEN_METRICS_CACHE_SECONDS", 5))
# WARDEN_MODEL_PRICES: JSON {provider: {"input": USD, "output": USD}} per million tokens, for the
# cost metric; default {} (cost 0, as for the scripted model).
WARDEN_MODEL_PRICES = json.loads(os.environ.get("WARDEN_MODEL_PRICES") or "{}")

# Tracing is OpenTelemetry's, configured by its standard variables and off unless they ask for
# it: OTEL_TRACES_EXPORTER (`otlp` or `console`) or OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT turn it
# on; OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none keep it off; OTEL_SERVICE_NAME names
# the service (default `warden`). The SDK reads the rest (sampler, headers, …) itself.
WARDEN_TRACING = not _env_bool("OTEL_SDK_DISABLED", False) and (
    os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() not in ("", "none")
    or bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
)
# WARDEN_TRACE_SQL: with tracing on, a span for every SQL statement too (the psycopg
# instrumentation); default off: at ~11 statements per engine step they cost ~15 % of a step.
WARDEN_TRACE_SQL = _env_bool("WARDEN_TRACE_SQL", False)

# WARDEN_PUBLIC_URL: where people reach this deployment; links in webhook bodies; default local.
WARDEN_PUBLIC_URL = os.environ.get("WARDEN_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")
# WARDEN_WEBHOOK_ALLOWED_HOSTS: comma-separated hostnames, addresses or networks ("hooks.internal,
# 10.0.0.0/8") webhooks may go to although they are loopback, private, link-local or multicast
# (notifications/targets.py); default none — in demo mode, the simulated services' host.
WARDEN_WEBHOOK_ALLOWED_HOSTS = [h.strip() for h in os.environ.get("WARDEN_WEBHOOK_ALLOWED_HOSTS", "").split(",") if h.strip()]
if WARDEN_DEMO and "WARDEN_WEBHOOK_ALLOWED_HOSTS" not in os.environ:
    WARDEN_WEBHOOK_ALLOWED_HOSTS = [urlsplit(WARDEN_SIM_BASE_URL).hostname or "127.0.0.1"]
# WARDEN_WEBHOOK_TIMEOUT_SECONDS: how long one delivery attempt waits for the receiver; default 10.
WARDEN_WEBHOOK_TIMEOUT_SECONDS = float(os.environ.get("WARDEN_WEBHOOK_TIMEOUT_SECONDS", 10))
# WARDEN_WEBHOOK_MAX_ATTEMPTS: attempts before a delivery is given up (shown failed); default 12.
WARDEN_WEBHOOK_MAX_ATTEMPTS = _env_int("WARDEN_WEBHOOK_MAX_ATTEMPTS", 12)
# WARDEN_WEBHOOK_RETRY_BASE_SECONDS: wait after the first failed attempt (doubles, with jitter,
# at most an hour); default 5.
WARDEN_WEBHOOK_RETRY_BASE_SECONDS = float(os.environ.get("WARDEN_WEBHOOK_RETRY_BASE_SECONDS", 5))
# WARDEN_APPROVAL_WARNING_SECONDS: an `approval.expiring` notification goes out this long before
# a pending approval expires; default 3600.
WARDEN_APPROVAL_WARNING_SECONDS = float(os.environ.get("WARDEN_APPROVAL_WARNING_SECONDS", 3600))
# WARDEN_APPROVAL_EMAIL: e-mail the people who may decide an operator approval when it is requested,
# reminded or escalated, each with their own decision link (docs/NOTIFICATIONS.md); default off.
WARDEN_APPROVAL_EMAIL = _env_bool("WARDEN_APPROVAL_EMAIL", False)
# EMAIL_HOST / EMAIL_PORT: the SMTP server approval e-mails go through; default localhost:25.
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = _env_int("EMAIL_PORT", 25)
# EMAIL_HOST_USER / EMAIL_HOST_PASSWORD: the SMTP login, if it wants one; default none.
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
# EMAIL_USE_TLS: STARTTLS on the SMTP connection; default off.
EMAIL_USE_TLS = _env_bool("EMAIL_USE_TLS", False)
# EMAIL_TIMEOUT: seconds one SMTP conversation may take before the attempt is retried; default 10.
EMAIL_TIMEOUT = float(os.environ.get("EMAIL_TIMEOUT", 10))
# DEFAULT_FROM_EMAIL: the sender of Warden's e-mails; default webmaster@localhost (Django's).
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "webmaster@localhost")
