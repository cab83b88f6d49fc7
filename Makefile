# failslow: `make demo` shows it working, `make test` runs every test. Both set themselves up.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# make test: pytest-xdist workers (most tests wait on servers and processes, not on the CPU)
TEST_WORKERS ?= 3

.PHONY: demo serve test chaos lint bench eval clean venv torch compat image-smoke stack-smoke

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "failslow needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: $(STAMP)
	$(VENV)/bin/failslow demo

serve: $(STAMP)
	$(VENV)/bin/failslow serve

# Every test: in TEST_WORKERS processes, then the `solo` ones alone (both run; either failing fails).
test: $(STAMP) torch
	@sh scripts/test-servers.sh
	@rc=0; \
	$(PY) -m pytest -q -rs --durations=15 -n $(TEST_WORKERS) -m "not solo" || rc=1; \
	$(PY) -m pytest -q -rs -m solo || rc=1; \
	exit $$rc

# The chaos tests three times in a row (issue 17's and issue 31's acceptance; docs/hardening.md):
# service, database and disk (needs root for tmpfs, and Debian's postgresql, as make test does),
# and shard processes killed and stopped mid-step.
chaos: $(STAMP)
	@sh scripts/test-servers.sh
	@for i in 1 2 3; do echo "chaos run $$i of 3"; \
	  $(PY) -m pytest -q -p no:cacheprovider tests/e2e/test_chaos.py \
	    tests/e2e/test_chaos_shards.py || exit 1; done

# PyTorch (optional extra) for the agents.torch tests: only from a local CPU wheel, never a
# multi-GB download; without it those tests are skipped with the reason.
torch: $(STAMP)
	@$(PY) -c 'import torch' 2>/dev/null || \
	  if ls /opt/wheels/torch-2.13.0*.whl >/dev/null 2>&1; then \
	    $(PY) -m pip install --quiet --find-links /opt/wheels torch==2.13.0; \
	  else echo "no local PyTorch wheel: the agents.torch tests will be skipped"; fi

# PyTorch's own distributed test suite (gloo, 2 ranks), plain and with failslow in every rank:
# no test may pass plain and fail with failslow (docs/pytorch-compat.md; ~25 min on 2 cores).
# make test runs a selection of it (tests/compat/test_pytorch_compat.py).
compat: $(STAMP) torch
	@mkdir -p var
	$(PY) -m tests.compat.run_suite --jobs 2 --json var/compat.json

lint: $(STAMP)
	$(VENV)/bin/ruff check cli service agents relay detectors harness wire migrations tests bench examples scripts
	$(VENV)/bin/lint-imports --no-cache

bench: $(STAMP)
	$(PY) bench/ingest_throughput.py
	$(PY) bench/agent_cost.py
	$(PY) bench/detection_scale.py

# Build the Docker image and check it for real (healthy, non-root, finds a fault); needs dockerd.
image-smoke: $(STAMP)
	@sh scripts/image-smoke.sh

# Bring the compose stack up for real (PostgreSQL, NATS, two replicas), find a fault through one
# replica, read it from the other, kill the job's owner; needs dockerd and docker-compose.
stack-smoke: $(STAMP)
	@sh scripts/stack-smoke.sh

eval: $(STAMP)
	$(VENV)/bin/failslow eval

clean:
	rm -rf $(VENV) var .pytest_cache
