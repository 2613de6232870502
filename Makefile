# Two commands matter: `make run` (the whole system with demo data) and `make test` (the suite).
# Each sets itself up on a fresh clone: virtualenv, dependencies, database, migrations.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: run test setup migrate bench stop-db clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet ".[test]"
	@touch $(STAMP)

setup: $(STAMP)

migrate: setup
	$(PY) manage.py migrate --noinput

run: migrate
	$(PY) manage.py demo_setup
	$(PY) manage.py serve_all

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

bench: migrate
	$(PY) bench/engine_step.py

stop-db: setup
	$(PY) manage.py embedded_db stop

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts
