# Every target creates or refreshes the virtual environment it needs: nothing is installed by hand.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip --disable-pip-version-check
# Trainer-level tests spawn DataLoader workers and DDP processes; keep each process to one thread
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
export PYTHONHASHSEED ?= 0

COMPAT_VENV ?= .venv-compat
COMPAT_STAMP := $(COMPAT_VENV)/.installed
DIST_VENV ?= .venv-dist
DIST_STAMP := $(DIST_VENV)/.installed
DIST_DIR ?= dist
# The Pythons `make pythons` tests: exactly those of pyproject.toml's requires-python and classifiers
# (tests/test_packaging.py checks). Others can be tried: `make pythons PYTHONS="3.11 3.12"`.
PYTHONS ?= 3.11
PYENV_ROOT ?= $(HOME)/.pyenv
# torch for `make pythons`: torch-ci.txt's version, CPU build only. PyPI has no `+cpu` build, so a Python without a
# CPU wheel on this machine fails at once instead of downloading the multi-GB CUDA build.
TORCH_CPU := $(shell sed -n 's/^torch==\([0-9.]*\).*/torch==\1+cpu/p' requirements/torch-ci.txt)

.PHONY: venv demo test lint compat docs bench dist dist-check pythons clean

$(STAMP): requirements/*.txt pyproject.toml src/lightning_midepoch/__about__.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet -r requirements/torch-ci.txt
	$(PIP) install --quiet -r requirements/ci.txt
	$(PIP) install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

demo: venv  ## the main job: train, SIGKILL mid-epoch, resume with and without the callback, report
	$(BIN)/python examples/demo.py --out demo-output

test: venv  ## every test, with branch coverage of src/ (at least 90%, enforced)
	$(BIN)/python -m pytest src/lightning_midepoch tests --cov --cov-report=term-missing -p no:cacheprovider

$(COMPAT_STAMP): requirements/compat.txt requirements/torch-ci.txt pyproject.toml src/lightning_midepoch/__about__.py
	test -x $(COMPAT_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip --disable-pip-version-check install --quiet -r requirements/torch-ci.txt
	$(COMPAT_VENV)/bin/python -m pip --disable-pip-version-check install --quiet -r requirements/compat.txt
	$(COMPAT_VENV)/bin/python -m pip --disable-pip-version-check install --quiet --no-deps --no-build-isolation -e .
	touch $(COMPAT_STAMP)

compat: venv $(COMPAT_STAMP)  ## the Trainer-level resume tests on the oldest supported Lightning and on pytorch_lightning
	$(COMPAT_VENV)/bin/python -c "import lightning; print('oldest supported: lightning', lightning.__version__)"
	$(COMPAT_VENV)/bin/python -m pytest tests/test_loops.py tests/test_distributed.py tests/test_legacy.py -q -p no:cacheprovider
	MIDEPOCH_TEST_NAMESPACE=pytorch_lightning $(BIN)/python -m pytest tests/test_loops.py tests/test_legacy.py -q -p no:cacheprovider

lint: venv  ## ruff and mypy --strict on src/
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

docs: venv  ## the documentation site in docs/_build/html (warnings are errors; tests/test_docs.py runs its examples)
	$(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

bench: venv  ## measurements, printed as tables; plots in benchmarks/results/
	$(PIP) install --quiet --no-deps -r requirements/bench.txt
	$(BIN)/python benchmarks/run_all.py

$(DIST_STAMP): requirements/dist.txt
	test -x $(DIST_VENV)/bin/python || $(PYTHON) -m venv $(DIST_VENV)
	$(DIST_VENV)/bin/python -m pip --disable-pip-version-check install --quiet -r requirements/dist.txt
	touch $(DIST_STAMP)

dist: $(DIST_STAMP)  ## the sdist, and the wheel built from it, in dist/ (python -m build); twine checks their metadata
	rm -rf $(DIST_DIR)
	$(DIST_VENV)/bin/python -m build --outdir $(DIST_DIR) .
	$(DIST_VENV)/bin/twine check --strict $(DIST_DIR)/*

dist-check: venv dist  ## the built sdist's contents; the wheel and a wheel built from the sdist, installed in a fresh venv
	MIDEPOCH_DIST_DIR=$(DIST_DIR) $(BIN)/python -m pytest tests/packaging -v --durations=0 -p no:cacheprovider

# one virtual environment per tested Python, .venv-py3.X (the interpreter from pyenv, else python3.X on PATH)
.venv-py%/.installed: requirements/pythons.txt requirements/torch-ci.txt pyproject.toml
	py=$$(ls -d $(PYENV_ROOT)/versions/$*.*/bin/python 2>/dev/null | sort -V | tail -n 1); \
	  py=$${py:-$$(command -v python$*)}; \
	  test -n "$$py" || { echo "make pythons: no Python $* on this machine"; exit 1; }; \
	  test -x $(@D)/bin/python || $$py -m venv $(@D)
	$(@D)/bin/python -m pip --disable-pip-version-check install --quiet --only-binary=:all: $(TORCH_CPU) || \
	  { echo "make pythons: no CPU build of $(TORCH_CPU) for Python $* here: not tested, so not claimed"; exit 1; }
	$(@D)/bin/python -m pip --disable-pip-version-check install --quiet -c requirements/torch-ci.txt \
	  -r requirements/pythons.txt
	$(@D)/bin/python -m pip --disable-pip-version-check install --quiet --no-deps --no-build-isolation -e .
	touch $@

pythons: $(foreach v,$(PYTHONS),.venv-py$(v)/.installed)  ## the Trainer-level tests on every supported Python
	set -e; for v in $(PYTHONS); do \
	  .venv-py$$v/bin/python -c "import sys, torch; print('Python', sys.version.split()[0], 'torch', torch.__version__)"; \
	  .venv-py$$v/bin/python -m pytest tests/test_loops.py tests/test_distributed.py -q \
	    -p no:cacheprovider; \
	done

clean:
	rm -rf $(VENV) $(COMPAT_VENV) $(DIST_VENV) .venv-py* build $(DIST_DIR) *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .coverage demo-output docs/_build
