# `make demo` and `make test` work from a fresh clone with Python 3.11 or 3.12 and make:
# each creates the virtualenv and installs what is missing first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
export PYTHONPATH := handler

.PHONY: demo test lint format sam bench soak clean

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(INSTALLED)

demo: $(INSTALLED)
	$(BIN)/pgdrain demo

test: $(INSTALLED)
	$(BIN)/python -m pytest -m "not slow"

lint: $(INSTALLED)
	$(BIN)/ruff check handler tests bench
	$(BIN)/ruff format --check handler tests bench
	$(BIN)/mypy

format: $(INSTALLED)
	$(BIN)/ruff format handler tests bench
	$(BIN)/ruff check --fix handler tests bench

clean:
	rm -rf $(VENV) .aws-sam .pytest_cache .mypy_cache .ruff_cache
