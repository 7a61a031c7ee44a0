# Set-up for a new user: `make demo` runs the main job, `make test` runs the tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck docs cli-docs install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/baton demo --crash 1 --pause 1

# Three pytest workers, one test file each at a time (many tests wait on TTLs and
# processes, so three fit two CPUs); `make test WORKERS=0` runs them in one process.
WORKERS ?= 3
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples flows
	$(BIN)/ruff format --check src tests benchmarks examples flows

typecheck: $(STAMP)
	$(BIN)/mypy
	MYPYPATH=src $(BIN)/mypy --strict tests/typing

docs: $(STAMP)
	$(BIN)/mkdocs build --strict

# Rewrites docs/cli.md from the Typer app; run it after changing any command's help.
cli-docs: $(STAMP)
	$(BIN)/python docs/_hooks/cli_reference.py

clean:
	rm -rf $(VENV) .baton
