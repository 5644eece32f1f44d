# Every target sets up what it needs: a virtual environment (reinstalled only when pyproject.toml or this file
# changes) and, for the tests, Prometheus. PYTHON picks the interpreter: python3 gets .venv, any other Python a
# virtual environment of its own, e.g. `make test PYTHON=python3.10` uses .venv-3.10 (a Python installed with
# pyenv is found even when it is not the active version).
PYTHON ?= python3
PYTHON_EXE := $(shell { $(PYTHON) -c 'import sys; print(sys.executable)' || \
  PYENV_VERSION="$$(pyenv versions --bare | paste -sd: -)" pyenv exec $(PYTHON) -c 'import sys; print(sys.executable)'; } 2>/dev/null)
PYTHON_VERSION := $(shell $(PYTHON_EXE) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
VENV ?= $(if $(filter python3,$(PYTHON)),.venv,.venv-$(PYTHON_VERSION))
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PJRT_DEVICE ?= CPU
# grafana-foundation-sdk (the dashboards extra) needs Python 3.11: an older Python goes without it, and without
# the tests that build dashboards.
comma := ,
EXTRAS := xla,auth,test,check$(if $(filter 3.10,$(PYTHON_VERSION)),,$(comma)dashboards)
.PHONY: venv check demo test test-fast test-trainer test-run-health test-compile-latest test-compat fuzz dashboards \
  prometheus bench \
  clean clean-compat

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -n "$(PYTHON_EXE)" || { echo "make: $(PYTHON) not found (e.g. pyenv install 3.10)" >&2; exit 2; }
	test -x $(PY) || { $(PYTHON_EXE) -m venv $(VENV) && echo '*' > $(VENV)/.gitignore; }
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

prometheus:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || { \
	  echo "installing Prometheus (Debian package)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; }

# The gates, in seconds: ruff lints and checks the formatting of the repository's Python (`ruff format` fixes
# it); mypy checks the package as Python 3.10, the oldest supported, and the mixin (the dashboards and rules
# generator) as 3.11, which the Grafana SDK needs (pyproject.toml has the settings and what is left out for now).
check: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m mypy --python-version 3.11 --cache-dir .mypy_cache/3.11 \
	  neuron_exporter/mixin/*.py neuron_exporter/mixin/*/*.py neuron_exporter/mixin/*/*/*.py

demo: venv prometheus
	$(PY) examples/demo.py

# The tests, selected by marker (pyproject.toml lists them): `make test` runs all but the Trainer run and the long
# run-health run, spread over the cores (pytest-xdist, a module to a worker: its tests share runs and fixtures);
# `make test-fast` leaves out the tests that train. Tests that build dashboards skip where the Grafana SDK is not installed (Python 3.10).
PARALLEL ?= -n auto --dist loadfile

test: venv prometheus
	$(PY) -m pytest -m 'not trainer and not run_health' $(PARALLEL)

test-fast: venv prometheus
	$(PY) -m pytest -m 'not trainer and not training and not run_health' $(PARALLEL)

# Two data-parallel runs of 26 minutes side by side, judged by the shipped rules as shipped (a 5m window, 15m for
# TrainingStraggler): the straggler of a restarted run is named, a balanced run never is.
test-run-health: venv prometheus
	$(PY) -m pytest -m run_health

# A real Hugging Face Trainer run (seconds once installed): transformers and accelerate go into the same virtual
# environment, with torch held at the version the xla extra pins.
TRAINER_STAMP := $(VENV)/.installed-trainer
$(TRAINER_STAMP): $(STAMP)
	$(PY) -c 'import torch; print("torch==" + torch.__version__.split("+")[0])' > $(VENV)/constraints.txt
	$(PY) -m pip install --quiet -c $(VENV)/constraints.txt -e '.[$(EXTRAS),trainer]'
	touch $@

test-trainer: $(TRAINER_STAMP)
	$(PY) -m pytest -m trainer

# The torch.compile and TorchNeuron tests on the newest torch, without torch_xla (torch_xla 2.9 needs torch 2.9): a
# virtual environment of its own, .venv-torch-latest (a minute to install, reinstalled like .venv). Dynamo's private
# APIs change between torch versions: this run checks the newest shape of each. Tests that need torch_xla skip there.
# TorchNeuron ships for Python 3.12 to 3.14 only: CI runs `make test-compile-latest PYTHON=python3.13`
# (.venv-torch-latest-3.13), whose `neuron` tests train on its emulated device (tests/support/torchneuron).
TORCH_LATEST := 2.14.1
LATEST_VENV := $(if $(filter python3,$(PYTHON)),.venv-torch-latest,.venv-torch-latest-$(PYTHON_VERSION))
LATEST_STAMP := $(LATEST_VENV)/.installed
$(LATEST_STAMP): pyproject.toml Makefile
	@test -n "$(PYTHON_EXE)" || { echo "make: $(PYTHON) not found (e.g. pyenv install 3.11)" >&2; exit 2; }
	test -x $(LATEST_VENV)/bin/python || { $(PYTHON_EXE) -m venv $(LATEST_VENV) && echo '*' > $(LATEST_VENV)/.gitignore; }
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LATEST_VENV)/bin/python -m pip install --quiet -e '.[auth]' 'pytest>=8' 'pytest-xdist>=3.5' numpy torch==$(TORCH_LATEST)
	touch $@

test-compile-latest: $(LATEST_STAMP)
	$(LATEST_VENV)/bin/python -m pytest -m 'compile or neuron' $(PARALLEL)

# The torch_xla scenario tests on older torch_xla releases (on demand, not in CI): each release with the torch and
# torchvision it was built against, in a virtual environment of its own (.venv-xla-2.7, .venv-xla-2.8; several GB
# each, reinstalled like .venv). The xla and test extras pin torch 2.9, so these install the auth extra, the test
# extra's requirements other than torch's, and the pins below. `make test-compat COMPAT_XLA=2.8` runs one release.
COMPAT_XLA ?= 2.7 2.8
COMPAT_PINS_2.7 := torch==2.7.* torch-xla==2.7.0 torchvision==0.22.*
COMPAT_PINS_2.8 := torch==2.8.* torch-xla==2.8.0 torchvision==0.23.*

.venv-xla-%/.installed: pyproject.toml Makefile
	@test -n "$(COMPAT_PINS_$*)" || { echo "make: no pins for torch_xla $* (COMPAT_PINS_$*)" >&2; exit 2; }
	test -x .venv-xla-$*/bin/python || { $(PYTHON_EXE) -m venv .venv-xla-$* && echo '*' > .venv-xla-$*/.gitignore; }
	.venv-xla-$*/bin/python -m pip install --quiet --upgrade pip 'tomli>=2; python_version < "3.11"'
	.venv-xla-$*/bin/python -c 'import sys; tomllib = __import__("tomllib" if sys.version_info >= (3, 11) else "tomli"); \
	  test = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]; \
	  print("\n".join(r for r in test if not r.startswith("torch")))' > .venv-xla-$*/test-requirements.txt
	.venv-xla-$*/bin/python -m pip install --quiet -e '.[auth]' -r .venv-xla-$*/test-requirements.txt $(COMPAT_PINS_$*)
	touch $@

# One release after the other (each suite takes both cores); every release runs even when one fails.
test-compat: $(COMPAT_XLA:%=.venv-xla-%/.installed)
	@failed=; for v in $(COMPAT_XLA); do \
	  echo "== torch_xla $$v: $$(.venv-xla-$$v/bin/python -c 'import torch, torch_xla; print("torch", torch.__version__, "torch_xla", torch_xla.__version__)')"; \
	  .venv-xla-$$v/bin/python -m pytest -m 'training and not compile' $(PARALLEL) || failed="$$failed $$v"; \
	done; test -z "$$failed" || { echo "make: torch_xla$$failed: tests failed" >&2; exit 1; }

fuzz: venv
	NEURON_EXPORTER_FUZZ_CASES=20000 $(PY) -m pytest -q -k fuzz

# The dashboards (dashboards/) and the rules (deploy/prometheus/rules/) from the mixin's code and configuration.
dashboards: venv
	$(PY) -m neuron_exporter.mixin

# The step costs (torch_xla, and TorchNeuron's eager loop on the emulated device in the newest torch's environment),
# then what serving a node costs (the daemon, a trainer scraped at a node of 128 ranks, scrapes under load).
bench: venv $(LATEST_STAMP)
	$(PY) benchmarks/step_overhead.py
	$(LATEST_VENV)/bin/python benchmarks/neuron_eager_overhead.py
	$(PY) benchmarks/daemon_scrape.py
	$(PY) benchmarks/daemon_scrape.py --rewrite 2
	$(PY) benchmarks/node_scale.py
	$(PY) benchmarks/scrape_under_load.py

clean:
	rm -rf $(VENV) $(LATEST_VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache

# The compatibility environments (`make test-compat`) are left to this one: several GB to download again.
clean-compat:
	rm -rf $(COMPAT_XLA:%=.venv-xla-%)
