# Set-up is part of every target: a fresh machine needs only `make demo` or `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# torch/torchvision are pinned: these versions install from the local disk.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
DEMO_OUT ?= demo_out
PYTEST_ARGS ?=

.PHONY: install test test-slow test-isa check format demo docs-cli check-docs bench clean

# Each target installs what it needs (issue 61): the demo the package and its calibrate extra (scikit-learn), the
# tests every extra they exercise (Ray Serve, moto, FAISS, ...: minutes more on a fresh clone).
DEMO_STAMP := $(VENV)/.installed-demo

$(VENV)/.venv-made:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_PINS)
	touch $@

$(DEMO_STAMP): pyproject.toml $(VENV)/.venv-made
	$(PY) -m pip install -q -e '.[calibrate]'
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml $(VENV)/.venv-made
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP) $(DEMO_STAMP)

install: $(STAMP)

# The quick suite; the long end-to-end tests (kills and resumes, the real server, torchrun, the device rehearsal, a
# real full disk) are marked slow or distributed and run by `make test-slow`; .ci/run runs both.
test: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not distributed" $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m "slow or distributed" $(PYTEST_ARGS)

# The scoring, kernel, model and search tests again with the instruction sets lowered (AVX2, then torch's baseline
# with dab's compiled kernels off): an assertion that holds only on this CPU's fastest paths fails on any machine
# (69 s on 2 cores of an AMD EPYC, Zen 4; .ci/run runs it). The rule it checks: docs/contributing.md.
test-isa: $(STAMP)
	scripts/test_lowered_isa.sh $(PY) $(PYTEST_ARGS)

demo: $(DEMO_STAMP)
	$(PY) -m dab_pipeline.cli.demo --out $(DEMO_OUT)

# Style and structure: ruff's formatter and linter (pyproject.toml [tool.ruff]), the import contracts, docs/cli.md.
check: $(STAMP)
	$(VENV)/bin/ruff format --check dab_pipeline tests benchmarks scripts
	$(VENV)/bin/ruff check dab_pipeline tests benchmarks scripts
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m dab_pipeline.cli.docgen --check docs/cli.md

format: $(STAMP)
	$(VENV)/bin/ruff format dab_pipeline tests benchmarks scripts
	$(VENV)/bin/ruff check --fix dab_pipeline tests benchmarks scripts

docs-cli: $(STAMP)
	$(PY) -m dab_pipeline.cli.docgen > docs/cli.md

check-docs: $(STAMP)
	$(PY) -m dab_pipeline.cli.docgen --check docs/cli.md

bench: $(STAMP)
	$(PY) benchmarks/extract.py
	$(PY) benchmarks/scoring.py

clean:
	rm -rf $(DEMO_OUT) .pytest_cache
