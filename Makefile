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

.PHONY: venv demo test lint compat docs bench clean

$(STAMP): requirements/*.txt setup.py pyproject.toml
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

$(COMPAT_STAMP): requirements/compat.txt requirements/torch-ci.txt setup.py pyproject.toml
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

clean:
	rm -rf $(VENV) $(COMPAT_VENV) build dist *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .coverage demo-output docs/_build
