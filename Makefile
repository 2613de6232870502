# Two commands matter: `make run` (the whole system with demo data) and `make test` (the suite).
# Each sets itself up on a fresh clone: virtualenv, dependencies, database, migrations.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: run test setup migrate bench bench-telemetry bench-api bench-ws soak stop-db clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet ".[test]"
	@touch $(STAMP)

setup: $(STAMP)

migrate: setup
	$(PY) manage.py migrate --noinput

# Demo mode (the demo world's webhook receiver page among it), logs as plain text.
run: export WARDEN_DEMO = 1
run: export WARDEN_LOG_FORMAT ?= plain
run: migrate
	$(PY) manage.py demo_setup
	$(PY) manage.py serve_all

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# Benchmarks are run by hand (never by the suite); results go to docs/BENCHMARKS.md and
# docs/RELIABILITY.md.
bench: migrate
	$(PY) bench/engine_step.py

# The same with tracing, JSON logs and metrics scrapes on (issue 15's overhead budget: <= 5 %).
bench-telemetry: migrate
	$(PY) bench/engine_step.py --telemetry off
	$(PY) bench/engine_step.py --telemetry on

bench-api: migrate
	$(PY) bench/runs_list.py

bench-ws: migrate
	$(PY) bench/ws_latency.py

soak: migrate
	$(PY) bench/chaos_soak.py

stop-db: setup
	$(PY) manage.py embedded_db stop

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts
