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
# With SIZE: where the Hub files go (default the HF cache), who fetches them (auto|client|workers;
# default auto: what fits the cluster), which revision.
DOWNLOAD_DIR ?=
FETCH ?=
REVISION ?=
HUB_FLAGS = --dataset $(DATASET) --size $(SIZE) $(if $(REVISION),--revision $(REVISION))

# OUT=s3://bucket/prefix: credentials and AWS_ENDPOINT_URL come from the environment as for any
# AWS tool; STORAGE_OPTIONS="endpoint_url=http://minio:9000 anon=false" adds s3fs options.
STORAGE_OPTIONS ?=

# CLUSTER=cluster_configs/NAME.yaml runs on the cluster it describes; REPORT=FILE.html saves
# Dask's performance report.
CLUSTER ?=
REPORT ?=

TOKENIZE_FLAGS = --out $(OUT) --encoding $(ENCODING) \
	$(if $(WORKERS),--workers $(WORKERS)) $(if $(SCHEDULER),--scheduler $(SCHEDULER)) \
	$(if $(CLUSTER),--cluster $(CLUSTER)) $(if $(REPORT),--report $(REPORT)) \
	$(foreach o,$(STORAGE_OPTIONS),--storage-option $(o))

.PHONY: install tokenize download test bench bench-pipeline bench-bound bench-10b demo-corpus clean scheduler worker inspect verify export

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstalls only when pyproject.toml changed since the last install. uv installs from its cache in
# seconds where pip takes minutes (torch, transformers, ...): it is handed pip's find-links and
# constraints (uv reads no pip.conf), and pip installs instead wherever uv cannot.
# Bytecode is compiled at install, as pip does by default and uv does only when asked: where
# PYTHONDONTWRITEBYTECODE is set (CI, most Docker images) no process writes a .pyc, and each one
# (a CLI call, a worker, its forkserver) compiled Dask, pandas and the rest again: ~1.8 s of CPU
# per process measured here, a third of a fresh clone's test suite. Our own lib/ too (editable).
EXTRAS := fast,llama,test,gcs,azure
pip_config = $(shell $(BIN)/python -m pip config list 2>/dev/null | sed -n "s/^\(global\|install\|:env:\)\.$(1)='\(.*\)'$$/\2/p" | tr ' ' '\n' | sort -u)
UV_FLAGS = $(foreach d,$(call pip_config,find-links),--find-links $(d)) \
	$(foreach c,$(call pip_config,constraint),--constraint $(c))
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python $(UV_FLAGS) -e '.[$(EXTRAS)]' \
		|| $(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	$(BIN)/python -m pip check
	$(BIN)/python -m compileall -q lib
	touch $(STAMP)

install: $(STAMP)

demo-corpus: $(STAMP)
	$(BIN)/tokenshards demo-corpus --to $(DEMO_DIR)

tokenize: $(STAMP)
ifeq ($(SIZE),)
	@test -f $(DEMO_DIR)/000_00000.parquet || $(BIN)/tokenshards demo-corpus --to $(DEMO_DIR)
	$(BIN)/tokenshards tokenize --input '$(DEMO_DIR)/*.parquet' $(TOKENIZE_FLAGS)
else
	$(BIN)/tokenshards tokenize $(HUB_FLAGS) $(TOKENIZE_FLAGS) \
		$(if $(DOWNLOAD_DIR),--download-dir $(DOWNLOAD_DIR)) $(if $(FETCH),--fetch $(FETCH))
endif

# Fetch only: make download SIZE=10B [DOWNLOAD_DIR=/data/fineweb]
download: $(STAMP)
	@test -n "$(SIZE)" || { echo "make download needs SIZE=10B|100B|350B"; exit 2; }
	$(BIN)/tokenshards download $(HUB_FLAGS) $(if $(DOWNLOAD_DIR),--to $(DOWNLOAD_DIR))

# The suite in TEST_PROCESSES processes (whole modules each, so a module's fixtures are made once);
# the tests marked serial (they measure wall time) then run alone. The 25 slowest are listed: where
# the suite's time goes, in every CI log.
TEST_PROCESSES ?= 3
# The serial part collects only the modules that mark a test serial (collecting all ~70 took ~7 s).
SERIAL_FILES = $(or $(shell grep -l "mark\.serial" tests/test_*.py),tests)
test: $(STAMP)
	$(BIN)/python -m compileall -q lib tests
	$(BIN)/python -m pytest -q -n $(TEST_PROCESSES) --dist loadfile -m "not serial" --durations=25 tests
	$(BIN)/python -m pytest -q -m serial $(SERIAL_FILES)

# The run fuzzer (tests/test_fuzz_run.py: damaged runs through every reading command) with a long,
# random budget; `make test` runs it short and fixed. A failure prints the example: add it to the
# test as an @example (the issue 55 rule: every failing example found stays in the suite).
FUZZ_EXAMPLES ?= 500
.PHONY: fuzz
fuzz: $(STAMP)
	TOKENSHARDS_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q --timeout 0 --hypothesis-show-statistics \
		tests/test_fuzz_run.py

# A cluster by hand, the documented way (`dask scheduler` / `dask worker`; the old
# `dask-scheduler` command was removed from distributed in 2026.6):
#   make scheduler                              # on one machine: tcp://HOST:8786, dashboard :8787
#   make worker SCHEDULER=tcp://HOST:8786       # on each machine, in the same project checkout
#   make tokenize SCHEDULER=tcp://HOST:8786
SCHEDULER_PORT ?= 8786
DASHBOARD_PORT ?= 8787
NWORKERS ?= -1
scheduler: $(STAMP)
	DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=5 \
		$(BIN)/dask scheduler --port $(SCHEDULER_PORT) --dashboard-address :$(DASHBOARD_PORT)

# One single-threaded worker process per core (NWORKERS=-1): tiktoken holds the GIL. Arrow's
# allocator keeps freed pages for a second, for the next partition's read (prestart.ARROW_MIMALLOC).
worker: $(STAMP)
	@test -n "$(SCHEDULER)" || { echo "make worker needs SCHEDULER=tcp://HOST:8786"; exit 2; }
	MIMALLOC_PURGE_DELAY=$${MIMALLOC_PURGE_DELAY:-1000} $(BIN)/dask worker $(SCHEDULER) --nworkers $(NWORKERS) --nthreads 1

# make inspect OUT=out/demo: the summary, and the lengths plot in OUT/lengths.png (out/ is in
# .gitignore); PLOT=FILE.png puts it elsewhere, PLOT= (empty) skips it.
PLOT ?= $(OUT)/lengths.png
inspect: $(STAMP)
	$(BIN)/tokenshards inspect $(OUT) $(if $(PLOT),--plot $(PLOT)) \
		$(foreach o,$(STORAGE_OPTIONS),--storage-option $(o))

# make verify OUT=out/demo [DEEP=1000]
DEEP ?=
verify: $(STAMP)
	$(BIN)/tokenshards verify $(OUT) $(if $(DEEP),--deep $(DEEP)) \
		$(foreach o,$(STORAGE_OPTIONS),--storage-option $(o))

# make export OUT=out/demo FORMAT=llmc|npy|nanogpt|megatron|olmo|datatrove|litdata [TO=out/demo-llmc] [VAL_TOKENS=64000] [SEED=0]
# (the default validation set, 10,485,760 tokens, is larger than the whole demo corpus)
# SEED=S shuffles with that seed; OUT="out/a out/b" WEIGHTS="0.7 0.3" [TOKENS=10B] mixes runs.
FORMAT ?= llmc
TO ?= $(firstword $(OUT))-$(FORMAT)
VAL_TOKENS ?=
SEED ?=
WEIGHTS ?=
TOKENS ?=
export: $(STAMP)
	$(BIN)/tokenshards export $(OUT) --format $(FORMAT) --to $(TO) $(if $(VAL_TOKENS),--val-tokens $(VAL_TOKENS)) \
		$(if $(SEED),--shuffle --seed $(SEED)) $(if $(WEIGHTS),--weights $(WEIGHTS)) $(if $(TOKENS),--tokens $(TOKENS)) \
		$(foreach o,$(STORAGE_OPTIONS),--storage-option $(o))

# make bench [MEGATRON_SRC=DIR]: DIR, a Megatron-LM git clone, adds its fast path as the peer (bench/peer_megatron.py).
# Then the scale rehearsal (bench/scale.py: tokenize, shuffled export, verify --deep, inspect at sizes 10x
# apart, on a `dask scheduler` + `dask worker` cluster): SCALE_TOKENS="1B 10B" where the disk allows, SCALE_TOKENS= skips it.
# The pipeline case (issue 57: our whole command against shared/bench/bare_pipeline.py with gpt2, Llama 3 and
# Qwen3 on PIPELINE_MB of held-out text, and one more partition's cost) runs within it; alone: make bench-pipeline.
SCALE_TOKENS ?= 100M 1B
PIPELINE_MB ?= 1000
bench: $(STAMP)
	$(BIN)/python bench/run.py --pipeline-mb $(PIPELINE_MB) $(if $(MEGATRON_SRC),--megatron-src $(MEGATRON_SRC))
	$(if $(strip $(SCALE_TOKENS)),$(BIN)/python bench/scale.py $(foreach t,$(SCALE_TOKENS),--tokens $(t)))

# Issue 57's three ratios and the per-partition cost alone (~10 min on a quiet 2-core machine; measure there:
# every wall-time ratio moves with what else runs, and the load is recorded beside each): bench/results-pipeline.json.
bench-pipeline: $(STAMP)
	$(BIN)/python bench/pipeline_case.py --mb $(PIPELINE_MB)

# How close those ratios can come while the checks stay (~5 min): the checks' CPU alone (spot check, UTF-8
# validation, sha256), interleaved with the bare pipeline, and with Dask's own cost per task added; and one more
# partition's spot check and three files: bench/results-checks-bound.json.
bench-bound: $(STAMP)
	$(BIN)/python bench/checks_bound.py --mb $(PIPELINE_MB)

# A real 10-billion-token run on this machine (issue 57): the corpus (~26 GB of text, make_corpus's ~1 GB pool
# repeated), tokenize (gpt2), verify --deep, inspect and a shuffled llmc export where the disk allows (~53 GB in all;
# checked first), on a `dask scheduler` + `dask worker` cluster. Runs unattended; its report is
# bench/results-scale-10b.json and a printed table. 23 minutes on 2 cores, quiet (28 Nov: corpus 7.5 min, tokenize
# 3.4 min, verify 1 min, export 6.8 min).
bench-10b: $(STAMP)
	$(BIN)/python bench/scale.py --tokens 10B --out bench/results-scale-10b.json

clean:
	rm -rf out data/demo .pytest_cache

# The documentation site (mkdocs + Material, in the test extra): `make docs` builds it into out/site,
# failing on any broken link or anchor; `make docs-serve` serves it at http://127.0.0.1:8000.
.PHONY: docs docs-serve
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve
