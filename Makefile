# Two commands matter: `make run` (the whole system with demo data) and `make test` (the suite).
# Each sets itself up on a fresh clone: virtualenv, dependencies, database, migrations.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: run test setup migrate bench bench-api bench-ws soak stop-db clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet ".[test]"
	@touch $(STAMP)

setup: $(STAMP)

migrate: setup
	$(PY) manage.py migrate --noinput

# `make run` is demo mode (WARDEN_DEMO=1): the demo world's app, tools, accounts and data, and its
# simulated payment service on a port of its own (:8001). Without WARDEN_DEMO none of them exists.
run: export WARDEN_DEMO = 1
run: migrate
	$(PY) manage.py demo_setup
	$(PY) manage.py serve_all

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# Benchmarks are run by hand (never by the suite); results go to docs/BENCHMARKS.md and
# docs/RELIABILITY.md. They drive the demo world, so they run in demo mode.
bench bench-api bench-ws soak: export WARDEN_DEMO = 1
bench: migrate
	$(PY) bench/engine_step.py

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
