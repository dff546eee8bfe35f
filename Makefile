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
# The Pythons `make pythons` tests: exactly pyproject.toml's classifiers, from requires-python's lower bound on
# (tests/test_packaging.py checks). A subset can be run: `make pythons PYTHONS="3.10 3.13"`.
PYTHONS ?= 3.10 3.11 3.12 3.13
PYENV_ROOT ?= $(HOME)/.pyenv
# where `make pythons` writes each Python's log (py3.X.log) and the summary (summary.txt)
PYTHONS_OUT ?= pythons-results
# the Trainer-level tests (loops, DataLoader workers, DDP) that `make pythons` and `make floor` run
TRAINER_TESTS := tests/test_loops.py tests/test_workers.py tests/test_distributed.py -m "not workers_matrix"
# shell: py=the interpreter of Python $(1) (3.X): pyenv's newest 3.X, else python3.X on PATH; an error if neither
FIND_PYTHON = py=$$(ls -d $(PYENV_ROOT)/versions/$(1).*/bin/python 2>/dev/null | sort -V | tail -n 1); \
	py=$${py:-$$(command -v python$(1) || true)}; \
	test -n "$$py" || { echo "no Python $(1) on this machine: install it (pyenv install $(1))" >&2; exit 1; }
# the versions a test run used, printed before it
SHOW_VERSIONS := import sys, torch, numpy, lightning; print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, \
	numpy {numpy.__version__}, lightning {lightning.__version__}")

# `make floor`: the Trainer-level tests on the lowest torch and numpy that pyproject.toml's dependencies accept
# (requirements/floor.txt; torch 2.1 has no wheel for Python 3.12+ and numpy 1.21 none for 3.11+)
FLOOR_VENV ?= .venv-floor
FLOOR_PYTHON ?= 3.10

# `make lightning-suite LIGHTNING=/path/to/lightning-checkout`: Lightning's own tests, stock and with the callback
# attached to every Trainer (tests/lightning_suite). Not part of CI: it needs a checkout of Lightning's repository.
LIGHTNING ?=
SUITE_VENV ?= .venv-lightning-suite
SUITE_STAMP := $(SUITE_VENV)/.installed
SUITE_OUT ?= lightning-suite-results
# the copy of the package to test: empty for this checkout (editable install), or another checkout's src/ folder
SUITE_SRC ?=
# pytest-xdist workers (at most 2 on a 2-core machine); 0 runs in one process
SUITE_WORKERS ?= 2
SUITE_DIRS ?= loops checkpointing tuner callbacks trainer/connectors
SUITE_RESULTS = $(abspath $(SUITE_OUT))
# $(call SUITE_PYTEST,attach,name): one run, with MIDEPOCH_SUITE_ATTACH=attach, into $(SUITE_OUT)/name.{xml,log}
SUITE_PYTEST = cd $(LIGHTNING)/tests/tests_pytorch && MIDEPOCH_SUITE_ATTACH=$(1) \
	PYTHONPATH=$(CURDIR)/tests/lightning_suite$(if $(SUITE_SRC),:$(abspath $(SUITE_SRC))) \
	$(abspath $(SUITE_VENV))/bin/python -m pytest $(SUITE_DIRS) -p midepoch_attach -p no:cacheprovider \
	--ignore=checkpointing/test_legacy_checkpoints.py --timeout=300 -rfE --color=no --durations=20 \
	$(if $(filter-out 0 1,$(SUITE_WORKERS)),-n $(SUITE_WORKERS)) -o junit_family=xunit1 \
	--junitxml=$(SUITE_RESULTS)/$(2).xml > $(SUITE_RESULTS)/$(2).log 2>&1; \
	tail -n 1 $(SUITE_RESULTS)/$(2).log; test -s $(SUITE_RESULTS)/$(2).xml

# `make upstream-suite`: the patch series for Lightning in UPSTREAM_PATCHES (git format-patch files, NNNN-*.patch,
# against Lightning's tag UPSTREAM_TAG), checked with `git apply --check` and applied to a source tree of that tag, its
# own tests run, then Lightning's tests (SUITE_DIRS) run on the stock and on the patched tree and compared. Each run
# imports its tree's own src/lightning (first on PYTHONPATH; .venv-lightning-suite only supplies the dependencies, and
# each log's header names the lightning imported). A test that fails only when patched must be listed, with its
# reason, in UPSTREAM_CHANGED. Not part of CI (it needs Lightning's repository, LIGHTNING_REPO: a clone or a mirror
# without a work tree); about 12 minutes on two idle cores (two runs of 5 to 6 minutes, and the series' tests), and
# up to twice that on a busy machine (24 minutes measured with other jobs running).
LIGHTNING_REPO ?= /work/.mirror/Lightning-AI+pytorch-lightning/repo
UPSTREAM_TAG ?= 2.6.5
UPSTREAM_PATCHES ?= upstream
UPSTREAM_CHANGED ?= $(UPSTREAM_PATCHES)/changed_tests.txt
UPSTREAM_SUITE_OUT ?= upstream-suite-results
# the two source trees, stock/ and patched/ (a git work tree), made afresh by each run
UPSTREAM_TREES ?= $(UPSTREAM_SUITE_OUT)/trees
# suite: exactly `make lightning-suite`'s pytest flags, Lightning's own pytest configuration (pyproject.toml: doctests,
# FutureWarnings as errors, strict xfail) left out; tree: with it, as Lightning's CI runs its tests
UPSTREAM_PYTEST_CONFIG ?= suite
UPSTREAM_RESULTS = $(abspath $(UPSTREAM_SUITE_OUT))
UPSTREAM_TOOL = $(SUITE_VENV)/bin/python tests/lightning_suite/upstream.py
# $(call UPSTREAM_IMPORT,tree): which lightning the tree's tests import (an error unless the tree's src/lightning)
UPSTREAM_IMPORT = cd $(1)/tests/tests_pytorch && PYTHONPATH=$(1)/src $(abspath $(SUITE_VENV))/bin/python -c \
	'import sys, lightning.pytorch as pl; print("imports lightning", pl.__version__, "from", pl.__file__); \
	sys.exit(not pl.__file__.startswith(sys.argv[1]))' $(1)/src/lightning/
# $(call UPSTREAM_COMPILE,tree): byte-compile the tree's src/ and tests once (with PYTHONDONTWRITEBYTECODE set, every
# process of a run, each spawned DDP one included, would otherwise compile all of Lightning's modules again)
UPSTREAM_COMPILE = cd $(1) && $(abspath $(SUITE_VENV))/bin/python -m compileall -q -j 2 src tests/tests_pytorch \
	|| echo "$(1): some files do not byte-compile (the tests will say which)"
# $(call UPSTREAM_PYTEST,tree,tests,name): Lightning's tests (relative to tests/tests_pytorch) on the source tree
# (an absolute path), into $(UPSTREAM_SUITE_OUT)/name.{xml,log}, with `make lightning-suite`'s flags
UPSTREAM_PYTEST = cd $(1)/tests/tests_pytorch && PYTHONPATH=$(1)/src:$(CURDIR)/tests/lightning_suite \
	$(abspath $(SUITE_VENV))/bin/python -m pytest $(2) -p suite_report -p no:cacheprovider \
	$(if $(filter tree,$(UPSTREAM_PYTEST_CONFIG)),,-c /dev/null --rootdir=. --confcutdir=.) \
	--ignore=checkpointing/test_legacy_checkpoints.py --timeout=300 -rfE --color=no --durations=20 \
	$(if $(filter-out 0 1,$(SUITE_WORKERS)),-n $(SUITE_WORKERS)) -o junit_family=xunit1 \
	--junitxml=$(UPSTREAM_RESULTS)/$(3).xml > $(UPSTREAM_RESULTS)/$(3).log 2>&1; \
	tail -n 1 $(UPSTREAM_RESULTS)/$(3).log; test -s $(UPSTREAM_RESULTS)/$(3).xml

.PHONY: venv demo test test-workers corpus fuzz chaos exit-codes lint compat strategies lightning-suite lightning-next upstream-suite upstream-check upstream-tree upstream-patches docs bench bench-gather mutation dist dist-check pythons compile-pythons floor clean

$(STAMP): requirements/*.txt pyproject.toml src/lightning_midepoch/__about__.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet -r requirements/torch-ci.txt
	$(PIP) install --quiet -r requirements/ci.txt
	$(PIP) install --quiet --no-deps -r requirements/ci-no-deps.txt
	$(PIP) install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

demo: venv  ## the main job: train, SIGKILL mid-epoch, resume with and without the callback, report
	$(BIN)/python examples/demo.py --out demo-output

# pytest-xdist workers for `make test` and `make compat` (one per core of the 2-core CI machine); 0 runs in one process
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS))

# `make test` runs WORKERS_SAMPLE of the larger DataLoader-worker matrix (the workers_matrix cases of
# tests/test_workers.py, one or two seconds each), another sample each run: WORKERS_SEED chooses them
# (tests/conftest.py), and pytest's header prints it; `make test WORKERS_SEED=123` (or MIDEPOCH_WORKERS_SEED=123)
# runs the same sample again, and `make test-workers` runs the whole matrix. MIDEPOCH_REQUIRE_TEST_DEPS=1: a data
# library this venv installs (datasets, torchdata, litdata) that cannot be imported fails its tests instead of
# skipping them (`make compat`, whose venv lacks some, skips them).
ifndef WORKERS_SEED
WORKERS_SEED := $(or $(MIDEPOCH_WORKERS_SEED),$(shell od -An -N4 -tu4 /dev/urandom | tr -d ' '))
endif
WORKERS_SAMPLE ?= 3
# ... and CORPUS_SAMPLE of the corpus's projects (tests/corpus, each a few seconds), chosen by CORPUS_SEED (printed in
# pytest's header; `make test CORPUS_SEED=123` or MIDEPOCH_CORPUS_SEED=123 repeats it); `make corpus` runs them all
ifndef CORPUS_SEED
CORPUS_SEED := $(or $(MIDEPOCH_CORPUS_SEED),$(shell od -An -N4 -tu4 /dev/urandom | tr -d ' '))
endif
CORPUS_SAMPLE ?= 3

# tests/upstream is not collected: it tests a Lightning patched with the upstream series, in its own environment
# without the package (`make upstream-check`)
test: venv  ## every test (a seeded sample of the workers matrix), with branch coverage of src/ (at least 90%, enforced)
	MIDEPOCH_REQUIRE_TEST_DEPS=1 MIDEPOCH_WORKERS_SAMPLE=$(WORKERS_SAMPLE) MIDEPOCH_WORKERS_SEED=$(WORKERS_SEED) \
		MIDEPOCH_CORPUS_SAMPLE=$(CORPUS_SAMPLE) MIDEPOCH_CORPUS_SEED=$(CORPUS_SEED) \
		$(BIN)/python -m pytest src/lightning_midepoch tests --ignore=tests/upstream $(XDIST) --cov \
		--cov-report=term-missing \
		-p no:cacheprovider --durations=15

test-workers: venv  ## the larger DataLoader-worker matrix of tests/test_workers.py (every worker count and moment)
	MIDEPOCH_WORKERS_SAMPLE= $(BIN)/python -m pytest tests/test_workers.py -m workers_matrix $(XDIST) -q \
		-p no:cacheprovider

CORPUS_OUT ?= corpus-results

# Not part of CI. Every project of tests/corpus/projects (real projects' patterns, shrunk): the uninterrupted fit with
# the callback against stock, a fit writing checkpoints, and resumes at three moments (and stock Lightning's resumes at
# the same moments, for the table's last column); each project's result as JSON and the table in
# $(CORPUS_OUT)/table.md. A project marked pending fails until its package fix lands.
corpus: venv  ## every corpus project (tests/corpus): transparency and three resumes each; the table in corpus-results/
	rm -rf $(CORPUS_OUT)
	MIDEPOCH_REQUIRE_TEST_DEPS=1 MIDEPOCH_CORPUS_OUT=$(CORPUS_OUT) MIDEPOCH_CORPUS_STOCK=1 \
		$(BIN)/python -m pytest tests/corpus -m corpus \
		$(XDIST) -q -p no:cacheprovider --durations=0 --color=no; rc=$$?; \
	$(BIN)/python tests/corpus/runner.py --table $(CORPUS_OUT) > $(CORPUS_OUT)/table.md; cat $(CORPUS_OUT)/table.md; \
	exit $$rc

# `make chaos CHAOS_SEED=123` repeats a run. CHAOS_DELIVERIES signals in all with the callback (CHAOS_DDP of them to
# 2-rank jobs, by timers), spread over the flows of tests/chaos.py, plus a stock control without it, and
# CHAOS_UNINTERRUPTED 2-rank SLURM jobs nobody signals (every task must exit 0), then the checkpoint's delay for a
# signal during a validation (stock and with the callback, one process and 2 ranks); about 30 minutes
ifndef CHAOS_SEED
CHAOS_SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
CHAOS_DELIVERIES ?= 300
CHAOS_DDP ?= 24
CHAOS_UNINTERRUPTED ?= 10
CHAOS_OUT ?= chaos-output

chaos: venv  ## pre-emption: signals delivered at CHAOS_DELIVERIES moments of fits, every resume compared (seed printed)
	rm -rf $(CHAOS_OUT)
	$(BIN)/python tests/chaos.py --deliveries $(CHAOS_DELIVERIES) --ddp $(CHAOS_DDP) --stock 16 --ddp-stock 4 \
		--uninterrupted $(CHAOS_UNINTERRUPTED) --validation-delay --seed $(CHAOS_SEED) --out $(CHAOS_OUT)

# `make fuzz FUZZ_SEED=123` repeats a run; `FUZZ_EXAMPLES=200` runs fewer examples
ifndef FUZZ_SEED
FUZZ_SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
FUZZ_EXAMPLES ?= 1000

fuzz: venv  ## every property test (hypothesis) with FUZZ_EXAMPLES random examples each (1000), seed printed
	@echo "fuzz seed: $(FUZZ_SEED) (make fuzz FUZZ_SEED=$(FUZZ_SEED) runs the same examples again)"
	HYPOTHESIS_PROFILE=fuzz MIDEPOCH_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest tests -m hypothesis \
		--hypothesis-seed=$(FUZZ_SEED) --hypothesis-show-statistics -p no:cacheprovider

$(COMPAT_STAMP): requirements/compat.txt requirements/torch-ci.txt pyproject.toml src/lightning_midepoch/__about__.py
	test -x $(COMPAT_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip --disable-pip-version-check install --quiet -r requirements/torch-ci.txt
	$(COMPAT_VENV)/bin/python -m pip --disable-pip-version-check install --quiet -r requirements/compat.txt
	$(COMPAT_VENV)/bin/python -m pip --disable-pip-version-check install --quiet --no-deps --no-build-isolation -e .
	touch $(COMPAT_STAMP)

# What `make compat` runs (`make test` runs everything on the pinned Lightning). On the oldest supported Lightning:
# every single-process resume test, and of the 2-process DDP tests (each about half a minute) one resume and one
# checkpoint written during an exception. In the pytorch_lightning namespace: the sampler and checkpoint-moment
# matrices and the legacy checkpoints.
COMPAT_SELECT ?= not test_distributed or injected or during_an_exception
NAMESPACE_SELECT ?= test_samplers or test_checkpoint_written_in_any_hook or test_validation or legacy

compat: venv $(COMPAT_STAMP)  ## the Trainer-level resume tests on the oldest supported Lightning and on pytorch_lightning
	$(COMPAT_VENV)/bin/python -c "import lightning; print('oldest supported: lightning', lightning.__version__)"
	$(COMPAT_VENV)/bin/python -m pytest tests/test_loops.py tests/test_legacy.py tests/test_compat.py \
		tests/test_distributed.py -k "$(COMPAT_SELECT)" $(XDIST) -q -p no:cacheprovider
	MIDEPOCH_TEST_NAMESPACE=pytorch_lightning $(BIN)/python -m pytest tests/test_loops.py tests/test_legacy.py \
		-k "$(NAMESPACE_SELECT)" $(XDIST) -q -p no:cacheprovider

# The heavier multi-process strategy cases (2 gloo processes each; `make test` runs one case of each strategy):
# ddp_spawn with the user's own DistributedSampler, FSDP with DataLoader workers at an epoch's last batch, and a
# SubsetRandomSampler with its own generator under DDP (`make test` runs the WeightedRandomSampler one). About 4
# minutes on two idle cores; not called by .ci/run (see the report in docs).
strategies: venv  ## the heavier strategy cases: fork launchers, spawn, FSDP (tests marked strategies_matrix)
	MIDEPOCH_STRATEGIES_MATRIX=1 $(BIN)/python -m pytest tests/test_distributed.py -m strategies_matrix $(XDIST) -q \
		-p no:cacheprovider --durations=0

$(SUITE_STAMP): requirements/lightning-suite.txt requirements/torch-ci.txt pyproject.toml
	test -x $(SUITE_VENV)/bin/python || $(PYTHON) -m venv $(SUITE_VENV)
	$(SUITE_VENV)/bin/python -m pip --disable-pip-version-check install --quiet -r requirements/torch-ci.txt
	$(SUITE_VENV)/bin/python -m pip --disable-pip-version-check install --quiet -r requirements/lightning-suite.txt
	$(SUITE_VENV)/bin/python -m pip --disable-pip-version-check install --quiet --no-deps --no-build-isolation -e .
	touch $(SUITE_STAMP)

lightning-suite: $(SUITE_STAMP)  ## Lightning's tests stock and with the callback attached (LIGHTNING=checkout)
	@test -d "$(LIGHTNING)/tests/tests_pytorch" || \
		{ echo "usage: make lightning-suite LIGHTNING=/path/to/lightning-checkout (release 2.6.6)"; exit 2; }
	mkdir -p $(SUITE_OUT)
	$(SUITE_VENV)/bin/python -c "import lightning, lightning_midepoch; print('lightning', lightning.__version__)"
	PYTHONPATH=$(SUITE_SRC) $(SUITE_VENV)/bin/python -c "import lightning_midepoch as m; print('testing', m.__file__)"
	@echo "stock run (MIDEPOCH_SUITE_ATTACH=0): $(SUITE_OUT)/stock.log"; date
	$(call SUITE_PYTEST,0,stock)
	@echo "attached run (MIDEPOCH_SUITE_ATTACH=1): $(SUITE_OUT)/attached.log"; date
	$(call SUITE_PYTEST,1,attached)
	@date
	$(SUITE_VENV)/bin/python tests/lightning_suite/compare.py $(SUITE_OUT)/stock.xml $(SUITE_OUT)/attached.xml \
		--allowed tests/lightning_suite/allowed_failures.txt > $(SUITE_OUT)/comparison.txt; \
		status=$$?; cat $(SUITE_OUT)/comparison.txt; exit $$status

upstream-suite: $(SUITE_STAMP)  ## the Lightning patch series (upstream/): applies, its tests pass, Lightning's tests compared
	@ls $(UPSTREAM_PATCHES)/*.patch > /dev/null 2>&1 || \
		{ echo "no patch series: $(UPSTREAM_PATCHES)/*.patch (make upstream-suite UPSTREAM_PATCHES=folder)"; exit 2; }
	rm -rf $(UPSTREAM_SUITE_OUT) $(UPSTREAM_TREES)
	mkdir -p $(UPSTREAM_SUITE_OUT)
	$(UPSTREAM_TOOL) tree $(LIGHTNING_REPO) $(UPSTREAM_TAG) $(abspath $(UPSTREAM_TREES))/stock
	$(UPSTREAM_TOOL) tree $(LIGHTNING_REPO) $(UPSTREAM_TAG) $(abspath $(UPSTREAM_TREES))/patched --git
	$(UPSTREAM_TOOL) apply $(abspath $(UPSTREAM_TREES))/patched $(sort $(wildcard $(UPSTREAM_PATCHES)/*.patch)) \
		> $(UPSTREAM_SUITE_OUT)/apply.log 2>&1; status=$$?; cat $(UPSTREAM_SUITE_OUT)/apply.log; exit $$status
	$(call UPSTREAM_COMPILE,$(abspath $(UPSTREAM_TREES))/stock)
	$(call UPSTREAM_COMPILE,$(abspath $(UPSTREAM_TREES))/patched)
	$(call UPSTREAM_IMPORT,$(abspath $(UPSTREAM_TREES))/stock)
	$(call UPSTREAM_IMPORT,$(abspath $(UPSTREAM_TREES))/patched)
	@tests="$$($(UPSTREAM_TOOL) tests $(abspath $(UPSTREAM_TREES))/patched $(sort $(wildcard $(UPSTREAM_PATCHES)/*.patch)))"; \
		echo "the series' own tests (on the patched tree): $${tests:-none}: $(UPSTREAM_SUITE_OUT)/series.log"; date; \
		if test -n "$$tests"; then $(call UPSTREAM_PYTEST,$(abspath $(UPSTREAM_TREES))/patched,$$tests,series); \
		else echo '<testsuite name="series" tests="0"/>' > $(UPSTREAM_SUITE_OUT)/series.xml; fi
	@echo "stock run ($(UPSTREAM_TAG)): $(UPSTREAM_SUITE_OUT)/stock.log"; date
	$(call UPSTREAM_PYTEST,$(abspath $(UPSTREAM_TREES))/stock,$(SUITE_DIRS),stock)
	@echo "patched run ($(UPSTREAM_TAG) and the series): $(UPSTREAM_SUITE_OUT)/patched.log"; date
	$(call UPSTREAM_PYTEST,$(abspath $(UPSTREAM_TREES))/patched,$(SUITE_DIRS),patched)
	@date
	{ cat $(UPSTREAM_SUITE_OUT)/apply.log; echo; \
	  $(SUITE_VENV)/bin/python tests/lightning_suite/compare.py $(UPSTREAM_SUITE_OUT)/stock.xml \
		$(UPSTREAM_SUITE_OUT)/patched.xml --label patched --series $(UPSTREAM_SUITE_OUT)/series.xml \
		$(if $(wildcard $(UPSTREAM_CHANGED)),--allowed $(UPSTREAM_CHANGED)); } > $(UPSTREAM_SUITE_OUT)/comparison.txt; \
		status=$$?; cat $(UPSTREAM_SUITE_OUT)/comparison.txt; exit $$status

# `make lightning-next`: the Trainer-level tests on Lightning's next release, installed from its repository's master
# (LIGHTNING_REPO, a clone or a mirror without a work tree) into .venv-lightning-next: `git archive` of NEXT_REF (only
# what the package's build reads: the mirror lacks some large files of docs/), `pip install` of that tree (the
# `lightning` package, its own version number), then this checkout's tests. Not part of CI (it needs Lightning's
# repository). The release differs from every checked one: the callback runs there with a warning naming what differs
# (docs: "Lightning releases"), and the tests say whether its runs are still stock's and its resumes exact. The log is
# $(NEXT_OUT)/tests.log, the tree's commit $(NEXT_OUT)/commit.txt; about 10 minutes on two idle cores.
NEXT_REF ?= master
NEXT_VENV ?= .venv-lightning-next
NEXT_OUT ?= lightning-next-results
NEXT_TESTS ?= tests/test_stock_parity.py tests/test_loops.py tests/test_workers.py tests/test_distributed.py \
	-m "not workers_matrix"

lightning-next:  ## the Trainer-level tests on Lightning's master (LIGHTNING_REPO), outside CI
	@test -d "$(LIGHTNING_REPO)" || { echo "no Lightning repository at LIGHTNING_REPO=$(LIGHTNING_REPO)"; exit 2; }
	rm -rf $(NEXT_OUT); mkdir -p $(NEXT_OUT)/tree
	git --git-dir=$(LIGHTNING_REPO) rev-parse $(NEXT_REF) > $(NEXT_OUT)/commit.txt
	git --git-dir=$(LIGHTNING_REPO) archive -o $(NEXT_OUT)/tree.tar $(NEXT_REF) setup.py pyproject.toml README.md src \
		requirements .actions
	tar -xf $(NEXT_OUT)/tree.tar -C $(NEXT_OUT)/tree && rm $(NEXT_OUT)/tree.tar
	test -x $(NEXT_VENV)/bin/python || $(PYTHON) -m venv $(NEXT_VENV)
	$(NEXT_VENV)/bin/python -m pip --disable-pip-version-check install --quiet -r requirements/torch-ci.txt
	grep -v -e '^lightning==' -e '^pytorch-lightning==' requirements/pythons.txt > $(NEXT_OUT)/requirements.txt
	$(NEXT_VENV)/bin/python -m pip --disable-pip-version-check install --quiet -c requirements/torch-ci.txt \
		-r $(NEXT_OUT)/requirements.txt
	$(NEXT_VENV)/bin/python -m pip --disable-pip-version-check install --quiet --no-build-isolation \
		-c requirements/torch-ci.txt $(NEXT_OUT)/tree
	$(NEXT_VENV)/bin/python -m pip --disable-pip-version-check install --quiet --no-deps --no-build-isolation -e .
	$(NEXT_VENV)/bin/python -c '$(SHOW_VERSIONS); print("from $(NEXT_REF)", open("$(NEXT_OUT)/commit.txt").read())' \
		| tee $(NEXT_OUT)/versions.txt
	$(NEXT_VENV)/bin/python -m pytest $(NEXT_TESTS) $(XDIST) -q -p no:cacheprovider --color=no -rfE \
		> $(NEXT_OUT)/tests.log 2>&1; status=$$?; tail -n 25 $(NEXT_OUT)/tests.log; exit $$status

# `make upstream-tree`: the series as commits to edit. A git checkout of Lightning's UPSTREAM_TAG in UPSTREAM_TREE,
# tagged `upstream-base`, with UPSTREAM_PATCHES/*.patch applied as one commit each (`git am`). Change it with git
# (`git rebase -i upstream-base`, `git commit --fixup`, new commits), then `make upstream-patches` writes the commits
# after `upstream-base` back into UPSTREAM_PATCHES (the old *.patch files removed first). The master series:
# `make upstream-tree upstream-patches UPSTREAM_TAG=master UPSTREAM_PATCHES=upstream/master` (upstream/README.md).
UPSTREAM_TREE ?= upstream-tree/$(UPSTREAM_TAG)
UPSTREAM_GIT = git -C $(UPSTREAM_TREE) -c user.name=upstream-tree -c user.email=upstream-tree@localhost

upstream-tree:  ## Lightning's UPSTREAM_TAG with the series as commits, in UPSTREAM_TREE (edit it there)
	@test ! -e $(UPSTREAM_TREE) || { echo "$(UPSTREAM_TREE) exists: write it back (make upstream-patches) or remove it"; exit 2; }
	@ls $(UPSTREAM_PATCHES)/*.patch > /dev/null 2>&1 || { echo "no patch series: $(UPSTREAM_PATCHES)/*.patch"; exit 2; }
	$(PYTHON) tests/lightning_suite/upstream.py tree $(LIGHTNING_REPO) $(UPSTREAM_TAG) $(abspath $(UPSTREAM_TREE)) --git
	$(UPSTREAM_GIT) tag upstream-base
	$(UPSTREAM_GIT) am --quiet --committer-date-is-author-date $(abspath $(UPSTREAM_PATCHES))/*.patch
	$(UPSTREAM_GIT) log --oneline upstream-base..HEAD

upstream-patches:  ## write the commits of UPSTREAM_TREE after upstream-base back into UPSTREAM_PATCHES/*.patch
	@test -d $(UPSTREAM_TREE)/.git || { echo "no $(UPSTREAM_TREE): make upstream-tree first"; exit 2; }
	@test -z "$$($(UPSTREAM_GIT) status --porcelain --untracked-files=no)" || \
		{ echo "$(UPSTREAM_TREE) has uncommitted changes: commit them first"; exit 2; }
	rm -f $(UPSTREAM_PATCHES)/*.patch
	$(UPSTREAM_GIT) format-patch --quiet --no-signature --zero-commit --abbrev=10 \
		-o $(abspath $(UPSTREAM_PATCHES)) upstream-base..HEAD
	@$(UPSTREAM_GIT) log --reverse --format=%s upstream-base..HEAD | while read -r subject; do echo "  $$subject"; done
	@$(PYTHON) tests/lightning_suite/upstream.py counts $(UPSTREAM_PATCHES)/*.patch

# `make upstream-check`: the Trainer-level resume tests of tests/upstream on the lightning wheel (ci.txt's release)
# with the src/lightning/ part of every UPSTREAM_PATCHES/*.patch applied (tools/apply_upstream.py: the release
# reinstalled first, so a re-run starts from it), in .venv-upstream, which must not have lightning-midepoch:
# MIDEPOCH_DELIVERY=lightning attaches no callback, the patched Lightning resumes by itself. Its uninterrupted runs
# are compared bitwise with stock Lightning's, recorded in .venv (tests/upstream/record_run.py) into a scratch folder.
# About 2.3 minutes on two cores with the environment created from scratch (1 minute of it): 76 tests in
# .venv-upstream, then the step-aside and cross-delivery tests.
UPSTREAM_CHECK_VENV ?= .venv-upstream
UPSTREAM_CHECK_BIN := $(UPSTREAM_CHECK_VENV)/bin

$(UPSTREAM_CHECK_VENV)/.installed: requirements/upstream-check.txt requirements/torch-ci.txt
	test -x $(UPSTREAM_CHECK_BIN)/python || $(PYTHON) -m venv $(UPSTREAM_CHECK_VENV)
	$(UPSTREAM_CHECK_BIN)/python -m pip --disable-pip-version-check install --quiet -r requirements/torch-ci.txt
	$(UPSTREAM_CHECK_BIN)/python -m pip --disable-pip-version-check install --quiet -r requirements/upstream-check.txt
	touch $@

upstream-check: venv $(UPSTREAM_CHECK_VENV)/.installed  ## the resume tests on Lightning patched with upstream/*.patch
	@if $(UPSTREAM_CHECK_BIN)/python -c "import lightning_midepoch" 2> /dev/null; then \
		echo "$(UPSTREAM_CHECK_VENV) can import lightning_midepoch, which must not be there: rm -rf it"; exit 1; \
	else echo "$(UPSTREAM_CHECK_VENV): lightning_midepoch cannot be imported (as required)"; fi
	$(UPSTREAM_CHECK_BIN)/python tools/apply_upstream.py $(UPSTREAM_PATCHES)
	@$(UPSTREAM_CHECK_BIN)/python -c '$(SHOW_VERSIONS); import pytest; print("pytest", pytest.__version__)'
	@records=$$(mktemp -d); cross=$$(mktemp -d); trap 'rm -rf "$$records" "$$cross"' EXIT; \
	echo "stock Lightning's uninterrupted runs, recorded in $(VENV) (tests/upstream/record_run.py)"; \
	PYTHONPATH=tests $(BIN)/python tests/upstream/record_run.py "$$records" && \
	echo "mid-epoch checkpoints written with the callback on stock Lightning (tests/upstream/write_checkpoints.py)" && \
	PYTHONPATH=tests $(BIN)/python tests/upstream/write_checkpoints.py "$$cross/callback" && \
	echo "MIDEPOCH_DELIVERY=lightning pytest tests/upstream ($(UPSTREAM_CHECK_VENV))" && \
	MIDEPOCH_DELIVERY=lightning MIDEPOCH_STOCK_RECORDS="$$records" MIDEPOCH_CROSS_CHECKPOINTS="$$cross" \
		$(UPSTREAM_CHECK_BIN)/python -m pytest tests/upstream --ignore=tests/upstream/test_step_aside.py \
		$(XDIST) -p no:cacheprovider --durations=10 && \
	echo "mid-epoch checkpoints written by the patched Lightning ($(UPSTREAM_CHECK_VENV))" && \
	MIDEPOCH_DELIVERY=lightning PYTHONPATH=tests $(UPSTREAM_CHECK_BIN)/python tests/upstream/write_checkpoints.py \
		"$$cross/lightning" && \
	echo "the callback on the patched Lightning steps aside ($(UPSTREAM_CHECK_VENV), this checkout's src/)" && \
	PYTHONPATH=src $(UPSTREAM_CHECK_BIN)/python -m pytest tests/upstream/test_step_aside.py -p no:cacheprovider && \
	echo "the patched Lightning's checkpoints resumed with the callback on stock Lightning ($(VENV))" && \
	MIDEPOCH_CROSS_CHECKPOINTS="$$cross" $(BIN)/python -m pytest tests/upstream/test_deliveries.py -p no:cacheprovider

lint: venv  ## ruff; mypy --strict on src/ and tools/; no test assertion that cannot fail (tools/check_asserts.py)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python tools/check_asserts.py tests

docs: venv  ## the documentation site in docs/_build/html (warnings are errors; tests/test_docs.py runs its examples)
	$(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

bench: venv  ## measurements, printed as tables; plots in benchmarks/results/
	$(PIP) install --quiet --no-deps -r requirements/bench.txt
	$(BIN)/python benchmarks/run_all.py

# `make exit-codes`: EXIT_JOBS uninterrupted two-node gloo jobs with the callback and as many stock, each rank's exit
# code counted (issue 37: a rank 0 that aborted after fit returned, once in CI); core dumps in exit-codes-output/
EXIT_JOBS ?= 100
exit-codes: venv  ## exit codes of uninterrupted 2-process gloo jobs, with the callback and stock (not in CI)
	$(BIN)/python tests/exit_codes.py --jobs $(EXIT_JOBS) --out exit-codes-output

bench-gather: venv  ## host memory of a DDP checkpoint inside an accumulation group (2 gloo processes, 100M parameters)
	$(BIN)/python benchmarks/bench_gather.py

# Not part of CI (about half an hour on two cores): mutates _sampling, _order and _state ([tool.mutmut] in
# pyproject.toml), runs their fast tests against each mutant, then lists every mutant that no test noticed.
mutation: venv  ## mutation testing of the index-level core with mutmut; results in mutants/
	$(PIP) install --quiet -r requirements/mutation.txt
	rm -rf mutants
	nice -n 10 $(BIN)/mutmut run --max-children 2
	$(BIN)/mutmut results

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

# one virtual environment per tested Python, .venv-py3.X. torch first, alone (torch-ci.txt's version): the CPU wheel
# where pip's find-links on this machine has one for that Python (3.11), else PyPI's build, made for CUDA (about
# 4.7 GB with its CUDA libraries, kept in pip's cache for the next environment), which runs without a GPU.
.venv-py%/.installed: requirements/pythons.txt requirements/torch-ci.txt pyproject.toml
	$(call FIND_PYTHON,$*); test -x $(@D)/bin/python || $$py -m venv $(@D)
	$(@D)/bin/python -m pip --disable-pip-version-check install --quiet --only-binary=:all: -r requirements/torch-ci.txt
	$(@D)/bin/python -m pip --disable-pip-version-check install --quiet -c requirements/torch-ci.txt \
	  -r requirements/pythons.txt
	$(@D)/bin/python -m pip --disable-pip-version-check install --quiet --no-deps --no-build-isolation -e .
	touch $@

# Not part of CI (the CUDA builds of torch are large; CI keeps one Python and `make compile-pythons`). Each Python in
# turn, whatever the previous one gave; one line per Python at the end, and a failure if any Python failed.
pythons:  ## the Trainer-level tests on every supported Python (3.10 to 3.13), each in .venv-py3.X
	@mkdir -p $(PYTHONS_OUT); : > $(PYTHONS_OUT)/summary.txt; failed=0; \
	for v in $(PYTHONS); do \
	  log=$(PYTHONS_OUT)/py$$v.log; start=$$(date +%s); : > $$log; echo "== Python $$v (log: $$log)"; \
	  if $(MAKE) --no-print-directory .venv-py$$v/.installed >> $$log 2>&1; then \
	    about=$$(.venv-py$$v/bin/python -c '$(SHOW_VERSIONS)' 2>&1); echo "$$about" | tee -a $$log; \
	    { .venv-py$$v/bin/python -m pytest $(TRAINER_TESTS) $(XDIST) -q -p no:cacheprovider --color=no; \
	      echo $$? > $$log.rc; } 2>&1 | tee -a $$log; \
	    rc=$$(cat $$log.rc); rm -f $$log.rc; result="$$(tail -n 1 $$log | tr -d '=' | sed 's/^ *//')"; \
	  else \
	    rc=1; about="no environment"; result="the install failed: $$(grep -m 1 ERROR $$log | cut -c 1-160)"; \
	  fi; \
	  test $$rc = 0 && status=ok || { status=FAILED; failed=1; }; \
	  echo "$$v $$status: $$result ($$about; $$(( $$(date +%s) - start )) s with the install)" \
	    >> $(PYTHONS_OUT)/summary.txt; \
	done; \
	echo; echo "make pythons:"; cat $(PYTHONS_OUT)/summary.txt; exit $$failed

# CI's cheap guard for the Pythons it does not run: src/ byte-compiles with the lowest and the highest supported
# Python (syntax, and SyntaxWarnings as errors), the .pyc files written to a scratch folder. A missing interpreter is
# an error, never a skip. Ruff's target-version (pyproject.toml) is the lowest supported Python.
compile-pythons:  ## byte-compile src/ with Python 3.10 and 3.13 (the ends of PYTHONS)
	@set -e; for v in $(firstword $(PYTHONS)) $(lastword $(PYTHONS)); do \
	  $(call FIND_PYTHON,$$v); scratch=$$(mktemp -d); \
	  PYTHONPYCACHEPREFIX=$$scratch $$py -W error -m compileall -q src/ || { rm -rf $$scratch; \
	    echo "src/ does not byte-compile with Python $$v ($$py)" >&2; exit 1; }; \
	  rm -rf $$scratch; echo "src/ byte-compiles with $$($$py -c 'import sys; print(sys.version.split()[0])')"; \
	done

$(FLOOR_VENV)/.installed: requirements/floor.txt pyproject.toml
	$(call FIND_PYTHON,$(FLOOR_PYTHON)); test -x $(FLOOR_VENV)/bin/python || $$py -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip --disable-pip-version-check install --quiet --only-binary=:all: \
	  -r requirements/floor.txt
	$(FLOOR_VENV)/bin/python -m pip --disable-pip-version-check install --quiet --no-deps -e .
	touch $@

# Not part of CI: torch 2.1's build, made for CUDA, is a multi-GB download (pip's cache keeps it).
floor: $(FLOOR_VENV)/.installed  ## the Trainer-level tests on the lowest torch and numpy pyproject.toml accepts
	$(FLOOR_VENV)/bin/python -c '$(SHOW_VERSIONS)'
	$(FLOOR_VENV)/bin/python -m pytest $(TRAINER_TESTS) $(XDIST) -q -p no:cacheprovider

clean:
	rm -rf $(VENV) $(COMPAT_VENV) $(SUITE_VENV) $(SUITE_OUT) $(NEXT_VENV) $(NEXT_OUT) $(UPSTREAM_SUITE_OUT) $(UPSTREAM_TREES) $(UPSTREAM_CHECK_VENV) $(DIST_VENV) $(FLOOR_VENV) .venv-py* $(PYTHONS_OUT) $(CORPUS_OUT) exit-codes-output build $(DIST_DIR) *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .coverage demo-output docs/_build mutants
