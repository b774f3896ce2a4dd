# The two-command contract (see README): `make demo` and `make test` work on a clean clone
# with nothing but Python 3.10+ installed. `make lab` starts JupyterLab on the walkthroughs.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.nbtoolkit-installed

.PHONY: setup test demo lab lint bench-load clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt scripts/setup.sh
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/setup.sh
	touch $(STAMP)

test: setup
	VENV=$(VENV) bash scripts/run_tests.sh

demo: setup
	VENV=$(VENV) bash scripts/demo.sh

lab: setup
	$(VENV)/bin/jupyter lab notebooks

lint: setup
	$(VENV)/bin/ruff check nbtoolkit tests benchmarks
	$(VENV)/bin/mypy

bench-load: setup
	$(PY) benchmarks/load_time.py

clean:
	rm -rf $(VENV) out
