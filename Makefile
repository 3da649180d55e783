# corpus-io: `make demo` runs the pipeline end to end; `make test` runs the tests.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Three pytest-xdist workers by default: the suite is CPU-bound (~48 CPU-minutes), yet its tests also wait on
# servers and child processes, so on 2 cores 3 workers take ~15% off a serial run (tests/conftest.py one_at_a_time
# keeps what is one per machine, Slurm and the in-tree build, to one worker at a time; slow tests go first).
# PYTEST_ARGS="-n 0" runs serially; PYTEST_ARGS="tests/x.py" runs one file, serially.
PYTEST_ARGS ?= -n 3

.PHONY: install system-packages real-recordings test demo smoke lint bench bench-smoke fixture clean

# Everything a machine with only Python needs: system packages (espeak-ng, sox, libsndfile, slurm-wlm, munge,
# chromium, chromium-driver), then .venv, then the real recordings (fetched once from PyPI, cached).
install: system-packages $(STAMP) real-recordings

system-packages:
	recipes/tools/install_system_packages.sh

# Reinstall only when the dependencies change; a second `make install` is instant. constraints.txt pins
# the versions the tests run with (pyproject.toml states ranges, for installs beside other toolkits).
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# Real recordings for the tests and the demo (LibriVox + CMU, 10 utterances, from the pocketsphinx sdist on
# PyPI; origin and licences in its ORIGIN.md), fetched once into ~/.cache/corpus-io: tests need no network.
real-recordings: $(STAMP)
	$(BIN)/python recipes/tools/real_recordings.py fetch

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check corpus_io cli tests bench recipes

# The espeak recipe end to end: synthesize, prepare, pack, train (torchrun, 2 processes), decode, CER table.
# Re-run one part with e.g. `make demo DEMO_ARGS="--stage 6 --stop_stage 7"`.
DEMO_ARGS ?=
demo: install
	recipes/espeak/run.sh $(DEMO_ARGS)

# The same recipe on a small corpus, 12 short epochs: a model that transcribes the digits (greedy CER 0-2.3 %)
# in under 2 minutes on 2 cores; tests/recipes/test_smoke.py runs it and checks its word timestamps.
SMOKE_DIR ?= recipes/espeak/exp/smoke
smoke: install
	xargs -a recipes/espeak/conf/smoke.opts recipes/espeak/run.sh --data $(abspath $(SMOKE_DIR))/data \
	  --exp $(abspath $(SMOKE_DIR))/exp  # xargs: the options file quotes a list of decode methods

bench: install
	$(BIN)/python -m bench $(BENCH)

# Every bench (or BENCH=...) on a tiny corpus, one round, in a temp dir: about a minute; the figures measure nothing
# (tests/test_benches.py runs each this way, so a change that breaks a bench fails the tests).
bench-smoke: install
	$(BIN)/python -m bench --smoke $(BENCH)

# Regenerate the committed fixture corpus (espeak-ng + sox).
fixture: install
	$(BIN)/python -m corpus_io.tables.synth fixture tests/fixtures/corpus

clean:
	rm -rf exp bench/out .pytest_cache
