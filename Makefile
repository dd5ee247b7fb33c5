# The two commands a new user needs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench bench-peers clean

$(VPY):
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VPY) examples/hello_mesh.py

test: $(STAMP)
	$(VPY) -m pytest -q tests

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src
	$(VENV)/bin/mypy --strict src/regency

bench: $(STAMP)
	$(VPY) benchmarks/run_regency.py

bench-peers: $(STAMP)
	$(VPY) benchmarks/run_peers.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
