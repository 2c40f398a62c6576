# Every target sets itself up: a fresh clone needs only python3 (>=3.10) and the package index.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SIZE ?=
DATASET ?= HuggingFaceFW/fineweb
OUT ?= out/$(if $(SIZE),fineweb-$(SIZE),demo)
WORKERS ?=
SCHEDULER ?=
ENCODING ?= gpt2
DEMO_DIR ?= data/demo

TOKENIZE_FLAGS = --out $(OUT) --encoding $(ENCODING) \
	$(if $(WORKERS),--workers $(WORKERS)) $(if $(SCHEDULER),--scheduler $(SCHEDULER))

.PHONY: install tokenize test bench demo-corpus clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstalls only when pyproject.toml changed since the last install.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	$(BIN)/python -m pip check
	touch $(STAMP)

install: $(STAMP)

demo-corpus: $(STAMP)
	$(BIN)/tokenshards demo-corpus --to $(DEMO_DIR)

tokenize: $(STAMP)
ifeq ($(SIZE),)
	@test -f $(DEMO_DIR)/000_00000.parquet || $(BIN)/tokenshards demo-corpus --to $(DEMO_DIR)
	$(BIN)/tokenshards tokenize --input '$(DEMO_DIR)/*.parquet' $(TOKENIZE_FLAGS)
else
	$(BIN)/tokenshards tokenize --dataset $(DATASET) --size $(SIZE) $(TOKENIZE_FLAGS)
endif

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

bench: $(STAMP)
	$(BIN)/python bench/run.py

clean:
	rm -rf out data/demo .pytest_cache
