## make                  create .venv and install pgdrain with its dev extras (nothing else)
## make help             this list
## make demo             migrate, enqueue example jobs, drain them, print what happened
## make test             the test suite (not the soak, not the simulator)
## make test-runtime     the unit and handler tests again under python3.12, the function's runtime
## make lint             ruff check, ruff format --check, mypy
## make format           ruff format, then ruff check --fix
## make soak             the chaos soak and its controls (PGDRAIN_SOAK_JOBS sets its size)
## make bench            benchmarks against the SQL ceiling and peers; writes docs/benchmarks.md
## make bench-scale      1M jobs, 10M of history, a server of its own, autovacuum on (~15 min)
## make simulate         the control-plane simulator, about 40 minutes; writes docs/simulate.md
## make simulate-smoke   the simulator's small form, under 2 minutes
## make simulate-test    the simulator's tests (tests/sim)
## make sam              sam validate --lint and sam build of the locked dependencies, with bytecode
## make lock             pin handler/requirements.in into handler/requirements.txt, with hashes
## make clean            remove the virtualenvs, .aws-sam and the tools' caches

# `make demo` and `make test` work from a fresh clone with Python 3.11 or 3.12 and make:
# each creates the virtualenv and installs what is missing first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
export PYTHONPATH := handler

.PHONY: help demo test test-runtime simulate-test lint format sam lock bench bench-scale soak clean

# The function's locked dependencies first, their hashes checked: the suite runs what the
# function runs (tests/unit/test_locked_dependencies.py fails if the two drift apart).
$(INSTALLED): pyproject.toml handler/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --require-hashes -r handler/requirements.txt
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(INSTALLED)

# The `## make` lines at the top of this file. Not the default goal: `make` alone still
# creates .venv (the first rule above).
help:
	@sed -n 's/^## //p' $(firstword $(MAKEFILE_LIST))

demo: $(INSTALLED)
	$(BIN)/pgdrain demo

# TEST_MARKERS and TEST_PATHS narrow a second pass (.ci/run: the machine's server) to what
# depends on the server.
TEST_MARKERS ?= not slow and not sim
TEST_PATHS ?=
# Two processes (pytest-xdist), each with its own embedded server, a test file to each at a
# time: the suite mostly waits (subprocesses, commits, the tests' own barriers), so two halve
# its time on two cores. TEST_WORKERS=0 runs it in one.
TEST_WORKERS ?= 2
test: $(INSTALLED)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "$(TEST_MARKERS)" $(TEST_PATHS)

# The function runs python3.12 (template.yaml's Runtime), the suite above the python that made
# .venv: the unit tests and the handler's own tests again in a virtualenv of python3.12 (pyenv's,
# found as `make sam` finds it), so a change that breaks only there fails here.
RUNTIME_VENV ?= .venv-runtime
RUNTIME_TESTS := tests/unit tests/integration/test_lambda_handler.py \
	tests/integration/test_lambda_job_errors.py tests/integration/test_recovery.py
test-runtime:
	@runtime="$$($(SAM_ENV) python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null)"; \
	if [ -z "$$runtime" ]; then \
		echo "make test-runtime: no python3.12 (the function's runtime) on PATH or in pyenv" >&2; \
		exit 1; \
	fi; \
	$(MAKE) --no-print-directory VENV=$(RUNTIME_VENV) PYTHON="$$runtime" $(RUNTIME_VENV)/.installed
	$(RUNTIME_VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not slow and not sim" \
		$(RUNTIME_TESTS)

# The simulator's smoke form end to end (tests/sim; the full measurement is `make simulate`).
simulate-test: $(INSTALLED)
	$(BIN)/python -m pytest -m sim tests/sim

# The chaos soak and its controls (docs/reliability.md): PGDRAIN_SOAK_JOBS sets the size.
soak: $(INSTALLED)
	$(BIN)/python -m pytest -m slow tests/soak

lint: $(INSTALLED)
	$(BIN)/ruff check handler tests bench sim
	$(BIN)/ruff format --check handler tests bench sim
	$(BIN)/mypy

format: $(INSTALLED)
	$(BIN)/ruff format handler tests bench sim
	$(BIN)/ruff check --fix handler tests bench sim

# `sam validate --lint` and `sam build`, offline and without Docker. aws-sam-cli lives in its own
# virtualenv (its pins may clash with moto's). `sam build` needs a python3.12 on PATH: with pyenv,
# the newest installed 3.12 is added next to the current version.
SAM_VENV ?= .venv-sam
SAM_INSTALLED := $(SAM_VENV)/.installed
SAM_PYENV := $(shell command -v python3.12 >/dev/null 2>&1 && command -v pyenv >/dev/null 2>&1 && pyenv versions --bare 2>/dev/null | grep -E '^3\.12\.[0-9]+$$' | sort -V | tail -1)
SAM_ENV := SAM_CLI_TELEMETRY=0 $(if $(SAM_PYENV),PYENV_VERSION=$(shell pyenv version-name 2>/dev/null):$(SAM_PYENV))

$(SAM_INSTALLED):
	$(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/python -m pip install --quiet --upgrade pip
	env -u PYTHONPATH $(SAM_VENV)/bin/python -m pip install --quiet aws-sam-cli
	touch $(SAM_INSTALLED)

# Then the build's bytecode, compiled by the runtime's Python (3.12): SAM ships sources only, and
# a function cannot cache bytecode (/var/task is read-only), so each cold start compiled every
# module it imports (`import app` 2x slower: docs/benchmarks.md). unchecked-hash: the zip
# does not keep the sources' timestamps, which the default check compares.
#
# sam build installs handler/requirements.txt, but fetches the runtime's (arm64) wheels by name
# and version, unchecked. So the wheels are fetched first, each checked against the lock's
# hashes, for the runtime and for the python3.12 sam runs here, and sam build may use those
# files only (PIP_NO_INDEX, PIP_FIND_LINKS).
SAM_WHEELS := .aws-sam/locked-wheels
RUNTIME_WHEELS := --only-binary=:all: --implementation cp --python-version 3.12 --abi cp312 \
	--abi abi3 --abi none --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64

sam: $(SAM_INSTALLED)
	$(SAM_ENV) $(SAM_VENV)/bin/sam validate --lint --region us-east-1
	rm -rf $(SAM_WHEELS)
	env -u PYTHONPATH $(SAM_VENV)/bin/python -m pip download --quiet --require-hashes --no-deps \
		-r handler/requirements.txt --dest $(SAM_WHEELS) $(RUNTIME_WHEELS)
	$(SAM_ENV) python3.12 -m pip download --quiet --require-hashes --no-deps --only-binary=:all: \
		-r handler/requirements.txt --dest $(SAM_WHEELS)
	$(SAM_ENV) PIP_NO_INDEX=1 PIP_FIND_LINKS=$(abspath $(SAM_WHEELS)) $(SAM_VENV)/bin/sam build
	$(SAM_ENV) python3.12 -m compileall -q -j 0 --invalidation-mode unchecked-hash .aws-sam/build

# handler/requirements.txt from handler/requirements.in: every package pinned, with the hashes
# of all its files (the runtime's arm64 wheels among them), resolved for the function's Python
# and platform. Run the tests after: the suite installs the new lock.
lock: $(INSTALLED)
	$(BIN)/python -m pip install --quiet uv
	$(BIN)/uv pip compile handler/requirements.in --generate-hashes --python-version 3.12 \
		--python-platform aarch64-manylinux_2_28 --custom-compile-command "make lock" \
		--output-file handler/requirements.txt

# `make bench` writes docs/benchmarks.md (+ .png). The peers it compares with (PgQueuer,
# Procrastinate) and matplotlib live in their own virtualenv, never in pgdrain's dependencies;
# graphile-worker (npm) in bench/graphile/node_modules, from its package-lock.json (`npm ci`,
# again only when the lock changed). Without npm the bench says so and leaves graphile out.
BENCH_VENV ?= .venv-bench
BENCH_INSTALLED := $(BENCH_VENV)/.installed
GRAPHILE_INSTALLED := bench/graphile/node_modules/.installed

$(BENCH_INSTALLED): pyproject.toml bench/requirements.txt
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet -r bench/requirements.txt -e '.[aws,embedded]'
	touch $(BENCH_INSTALLED)

$(GRAPHILE_INSTALLED): bench/graphile/package.json bench/graphile/package-lock.json
	@if command -v npm >/dev/null; then \
		cd bench/graphile && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else echo "npm not found: make bench leaves graphile-worker out"; fi

bench: $(BENCH_INSTALLED) $(GRAPHILE_INSTALLED)
	$(BENCH_VENV)/bin/python -m bench.run

# Flat at scale (bench/scale.py): throughput over 1,000,000 jobs in windows of 50,000 and claim
# latency with 10,000,000 finished jobs in history, on a PostgreSQL server of its own started
# from the machine's binaries with production settings (autovacuum on). Not part of `make
# bench`: about 15 minutes on a shared 2-core machine. SCALE_ARGS sizes it, e.g.
# SCALE_ARGS="--jobs 300000 --history 2000000". Writes its section of docs/benchmarks.md (+ .json)
# as `--label now`; the baseline before the table split is kept as `--label before`.
SCALE_ARGS ?=
bench-scale: $(BENCH_INSTALLED)
	$(BENCH_VENV)/bin/python -m bench.scale --write $(SCALE_ARGS)

clean:
	rm -rf $(VENV) $(SAM_VENV) $(BENCH_VENV) $(SIM_VENV) $(RUNTIME_VENV) .aws-sam .pytest_cache .mypy_cache .ruff_cache

# `make simulate` measures the control plane with the simulator (sim/, docs/simulate.md): the
# real handler in processes, a stand-in for Lambda and EventBridge Scheduler, real PostgreSQL
# (DATABASE_URL, else the embedded one). The full form takes about 40 minutes and writes
# docs/simulate.md, .json and .png; `make simulate-smoke` runs the small form (< 2 minutes).
# matplotlib (for the plot) lives in the simulator's own virtualenv.
SIM_VENV ?= .venv-sim
SIM_INSTALLED := $(SIM_VENV)/.installed

.PHONY: simulate simulate-smoke

$(SIM_INSTALLED): pyproject.toml sim/requirements.txt
	$(PYTHON) -m venv $(SIM_VENV)
	$(SIM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(SIM_VENV)/bin/python -m pip install --quiet -r sim/requirements.txt -e '.[aws,embedded,invoke]'
	touch $(SIM_INSTALLED)

simulate: $(SIM_INSTALLED)
	$(SIM_VENV)/bin/python -m sim

simulate-smoke: $(SIM_INSTALLED)
	$(SIM_VENV)/bin/python -m sim --smoke
