"""Warden settings. Everything deployment-specific comes from environment variables,
each documented where it is read."""

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


# SECRET_KEY: signs sessions and CSRF tokens. The default is for local development only.
SECRET_KEY = os.environ.get("SECRET_KEY", "warden-insecure-development-key-change-me")
# WARDEN_DEMO: demo mode (the demo world, its simulated payment service and the desk's demo controls); default off.
WARDEN_DEMO = _env_bool("WARDEN_DEMO", False)
# DEBUG: Django's debug mode; off unless set to 1/true.
DEBUG = _env_bool("DEBUG", False)
# ALLOWED_HOSTS: comma-separated host names this server answers to; default local only.
ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",") if h.strip()]
# CSRF_TRUSTED_ORIGINS: comma-separated origins allowed to POST with cookies; default the local server.
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "http://127.0.0.1:8000,http://localhost:8000").split(",") if o.strip()
]

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
    # Listed so /api/v1/docs renders ninja's bundled Swagger UI (static files), never a CDN's.
    "ninja",
    "sessions_app",
    "runs_app",
    "tools_app",
    "approvals_app",
    "tools_app.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "config.asgi.application"

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

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

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
# WARDEN_SWEEP_SECONDS: how often the sweeper looks for expired leases, due backoffs and approvals; default 5.
WARDEN_SWEEP_SECONDS = float(os.environ.get("WARDEN_SWEEP_SECONDS", 5))
# WARDEN_MAX_MODEL_CALLS: default budget of model calls per run; default 20.
WARDEN_MAX_MODEL_CALLS = _env_int("WARDEN_MAX_MODEL_CALLS", 20)
# WARDEN_MAX_TOKENS: default budget of total tokens per run; default 200000.
WARDEN_MAX_TOKENS = _env_int("WARDEN_MAX_TOKENS", 200_000)
# WARDEN_RUN_DEADLINE_SECONDS: default wall-clock limit of a run from its creation; default 3600.
WARDEN_RUN_DEADLINE_SECONDS = _env_int("WARDEN_RUN_DEADLINE_SECONDS", 3600)
# WARDEN_MAX_MODEL_RETRIES: transient model errors tolerated per run before it fails; default 5.
WARDEN_MAX_MODEL_RETRIES = _env_int("WARDEN_MAX_MODEL_RETRIES", 5)
# WARDEN_RETRY_BASE_SECONDS: first backoff after a transient model error (doubles, with jitter); default 1.
WARDEN_RETRY_BASE_SECONDS = float(os.environ.get("WARDEN_RETRY_BASE_SECONDS", 1))
# WARDEN_APPROVAL_TTL_SECONDS: how long an approval request stays open; default 86400 (a day).
WARDEN_APPROVAL_TTL_SECONDS = _env_int("WARDEN_APPROVAL_TTL_SECONDS", 86_400)
# WARDEN_CONTEXT_TOKENS: token window of the model context built from history; default 8000.
WARDEN_CONTEXT_TOKENS = _env_int("WARDEN_CONTEXT_TOKENS", 8000)
# WARDEN_RECONCILE_GRACE_SECONDS: how long after an ambiguous write a "not found downstream"
# answer is still treated as "maybe not booked yet" rather than "not applied"; default 30.
WARDEN_RECONCILE_GRACE_SECONDS = float(os.environ.get("WARDEN_RECONCILE_GRACE_SECONDS", 30))
# WARDEN_FOUR_EYES: forbid operators from approving requests raised in their own sessions; default on.
WARDEN_FOUR_EYES = _env_bool("WARDEN_FOUR_EYES", True)
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
# tools (imported at start-up); default the demo world's tools.
WARDEN_TOOL_MODULES = [m.strip() for m in os.environ.get("WARDEN_TOOL_MODULES", "tools_app.demo.tools").split(",") if m.strip()]
# Model providers by name: the class (dotted path) implementing runs_app.providers.base.Provider.
WARDEN_PROVIDERS = {
    "scripted": "runs_app.providers.scripted.ScriptedProvider",
    "openai": "runs_app.providers.openai.OpenAIProvider",
}
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

# WARDEN_SIM_BASE_URL: where demo tools reach the simulated order/payment service; default this server.
WARDEN_SIM_BASE_URL = os.environ.get("WARDEN_SIM_BASE_URL", "http://127.0.0.1:8000/sim")

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
    # WARDEN_Q_POLL: seconds between broker polls; default 0.05.
    "poll": float(os.environ.get("WARDEN_Q_POLL", 0.05)),
    "recycle": 500,
    "label": "Task queue",
}
if REDIS_URL and _env_bool("WARDEN_REDIS_BROKER", False):
    # WARDEN_REDIS_BROKER: use Redis as the task broker instead of the ORM; default off.
    Q_CLUSTER.pop("orm")
    Q_CLUSTER["redis"] = REDIS_URL
