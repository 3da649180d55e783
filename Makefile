# corpus-io: `make demo` runs the pipeline end to end; `make test` runs the tests.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install test demo smoke lint bench fixture clean

install: $(STAMP)

# Reinstall only when the dependency list changes; a second `make install` is instant.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check corpus_io cli tests bench recipes

demo: install
	$(BIN)/corpus-io scp2jsonl \
	  ++scp_file_list='["tests/fixtures/corpus/wav.scp","tests/fixtures/corpus/text"]' \
	  ++data_type_list='["source","target"]' ++jsonl_file_out=exp/demo/train.jsonl
	head -n 3 exp/demo/train.jsonl

bench: install
	$(BIN)/python -m bench $(BENCH)

# Regenerate the committed fixture corpus (espeak-ng + sox).
fixture: install
	$(BIN)/python -m corpus_io.synth fixture tests/fixtures/corpus

clean:
	rm -rf exp bench/out .pytest_cache
