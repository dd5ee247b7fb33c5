# The two commands a new user needs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The compatibility suite (tests/compat) against Monarch itself, in its own venv.
BENCH_VENVS ?= $(CURDIR)/.bench-venvs
MONARCH_VENV := $(BENCH_VENVS)/monarch
MPY := $(MONARCH_VENV)/bin/python
COMPAT_ARGS := -q -p no:cacheprovider tests/compat

.PHONY: demo test lint bench bench-peers clean compat compat-monarch monarch-venv

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

# tests/compat against regency (also part of `make test`, which runs everything under tests/).
compat: $(STAMP)
	COMPAT_IMPL=regency $(VPY) -m pytest $(COMPAT_ARGS)

# The oracle: torch + torchmonarch 0.7.0 + pytest, built by benchmarks/setup_peers.sh.
monarch-venv:
	BENCH_VENVS=$(BENCH_VENVS) benchmarks/setup_peers.sh monarch
	$(MPY) -c 'import pytest, pytest_timeout' 2>/dev/null || \
		$(MPY) -m pip install --quiet 'pytest>=8' 'pytest-timeout>=2.3'

# The same scenarios against real Monarch; --confcutdir keeps tests/conftest.py (which imports
# regency) out, and regency is not on that venv's path.
compat-monarch: monarch-venv
	env -u PYTHONPATH COMPAT_IMPL=monarch $(MPY) -m pytest --confcutdir=tests/compat $(COMPAT_ARGS)

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
