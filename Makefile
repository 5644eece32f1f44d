# Every target sets up what it needs: a virtual environment in .venv (reinstalled only when
# pyproject.toml or this file changes) and, for the tests, Prometheus.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PJRT_DEVICE ?= CPU

.PHONY: venv demo test fuzz dashboards prometheus bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[xla,auth,dashboards,test]'
	touch $@

prometheus:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || { \
	  echo "installing Prometheus (Debian package)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; }

demo: venv prometheus
	$(PY) examples/demo.py

test: venv prometheus
	$(PY) -m pytest

fuzz: venv
	NEURON_EXPORTER_FUZZ_CASES=20000 $(PY) -m pytest -q -k fuzz

dashboards: venv
	$(PY) -m dashboards.build

bench: venv
	$(PY) benchmarks/step_overhead.py
	$(PY) benchmarks/daemon_scrape.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
