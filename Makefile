# Two commands matter: `make run` (the whole system with demo data) and `make test` (the suite).
# Each sets itself up on a fresh clone: virtualenv, dependencies, database, migrations.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Two installs, each pinned with its hashes: what CI tested is what installs. pyproject.toml's ranges
# are the source; `make lock` refreshes both files from them (README, "Dependencies").
# LOCK: the run-time (and the build backend) — all `make run` installs.
# DEV_LOCK: the run-time again plus the test and bench extras, the shared packages pinned exactly as
# in LOCK (compiled against it); `make test` and `make bench*` add what it has beyond LOCK.
LOCK := requirements.lock
DEV_LOCK := requirements-dev.lock
RUNTIME_STAMP := $(VENV)/.runtime-stamp
STAMP := $(VENV)/.installed-stamp
# The Python client and `warden` command (client/, its own package, depending only on httpx): the
# suite tests it, so the test install adds it, editable and without dependencies.
CLIENT := $(wildcard client/pyproject.toml)
PIP_COMPILE_ARGS ?=
PYTEST_ARGS ?=
# The suite runs in two processes (pytest-xdist), a file at a time each; with the embedded server each
# has a PostgreSQL server of its own (tests/settings.py). `make test TEST_WORKERS=0` runs it in one.
TEST_WORKERS ?= 2
PYTEST_PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

.PHONY: run test setup setup-runtime migrate lock bench bench-concurrent bench-telemetry bench-api bench-ws soak stop-db clean

# Local commands run in demo mode, where the development SECRET_KEY is accepted (config/settings.py);
# the test suite brings its own key (tests/settings.py).
run migrate bench bench-api bench-ws soak stop-db: export WARDEN_DEMO ?= 1

$(RUNTIME_STAMP): $(LOCK)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes --no-deps -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation .
	@touch $(RUNTIME_STAMP)

# Already-installed pins are skipped: after `make run` this adds the extras only.
$(STAMP): $(RUNTIME_STAMP) $(DEV_LOCK) $(CLIENT)
	$(PY) -m pip install --quiet --require-hashes --no-deps -r $(DEV_LOCK)
	$(if $(CLIENT),$(PY) -m pip install --quiet --no-deps --no-build-isolation -e client)
	@touch $(STAMP)

# The run-time only (`make run`, `make migrate`).
setup-runtime: $(RUNTIME_STAMP)

# Everything: the run-time, the test and bench extras, the client (`make test`, `make bench*`).
setup: $(STAMP)

migrate: setup-runtime
	$(PY) manage.py migrate --noinput

# `make run` is demo mode (WARDEN_DEMO=1): the demo world's app, tools, accounts and data, and its
# simulated payment service on a port of its own (:8001). Without WARDEN_DEMO none of them exists.
# Logs as plain text.
run: export WARDEN_DEMO = 1
run: export WARDEN_LOG_FORMAT ?= plain
run: migrate
	$(PY) manage.py demo_setup
	$(PY) manage.py serve_all

test: setup
	$(PY) -m pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

# Benchmarks are run by hand (never by the suite); results go to docs/BENCHMARKS.md and
# docs/RELIABILITY.md. They drive the demo world, so they run in demo mode.
bench bench-telemetry bench-api bench-ws soak: export WARDEN_DEMO = 1
# Issue 16: Warden's engine and the PostgreSQL floor, interleaved with the peers (DBOS, LangGraph)
# where ../shared/bench/peers is present (they get a virtualenv of their own, .warden/peers-venv),
# then worker throughput and queue pickup: one table on stdout, .warden/bench/result.json.
# Sizes from the environment or the command line (`make bench ROUNDS=1 M=10`): bench/compare.py --help.
bench: setup migrate
	$(PY) bench/compare.py

# The same with tracing, JSON logs and metrics scrapes on (issue 15's overhead budget: <= 5 %).
bench-telemetry: setup migrate
	$(PY) bench/telemetry_overhead.py

bench-api: setup migrate
	$(PY) bench/runs_list.py

bench-ws: setup migrate
	$(PY) bench/ws_latency.py

# Issue 34: many runs per worker process on the peers' slow-model workload (../shared/bench/peers:
# its model server, N conversations, latency L, K tool turns), beside the plain-asyncio ceiling,
# LangGraph and DBOS in the same run; sizes with SIZES=small,large (bench/slow_model.py --help).
bench-concurrent: setup migrate
	$(PY) bench/slow_model.py

soak: setup migrate
	$(PY) bench/chaos_soak.py

# After changing dependencies in pyproject.toml (needs the package index). Keeps every other pin;
# `make lock PIP_COMPILE_ARGS=--upgrade` moves everything to the newest versions the ranges allow.
# The run-time lock first; the dev lock is compiled against it (-c), so a package both hold has one pin.
lock:
	@test -x .venv-lock/bin/pip-compile || ($(PYTHON) -m venv .venv-lock && .venv-lock/bin/pip install --quiet "pip-tools>=7.4,<8")
	CUSTOM_COMPILE_COMMAND="make lock" .venv-lock/bin/pip-compile --quiet --generate-hashes --allow-unsafe \
		--build-deps-for wheel --strip-extras --no-emit-index-url --no-emit-find-links \
		$(PIP_COMPILE_ARGS) -o $(LOCK) pyproject.toml
	CUSTOM_COMPILE_COMMAND="make lock" .venv-lock/bin/pip-compile --quiet --generate-hashes --allow-unsafe \
		--extra test --extra bench -c $(LOCK) --strip-extras --no-emit-index-url --no-emit-find-links \
		$(PIP_COMPILE_ARGS) -o $(DEV_LOCK) pyproject.toml

stop-db: setup-runtime
	$(PY) manage.py embedded_db stop

clean:
	rm -rf $(VENV) .venv-lock .pytest_cache test-artifacts
