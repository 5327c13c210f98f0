# Firepool: `make demo` runs the main job on the embedded defaults, `make test` runs every test.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed

.PHONY: demo test unit integration lint bench clean fuzz

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP) $(DEMO_STAMP)

# The demo needs only the broker's own dependencies: no torch, no dev tools, no editable build
# (`make test` installs all of that, editable, over it). Pip runs without -q so its progress shows.
$(DEMO_STAMP): pyproject.toml
	@echo "==> make demo: setting up $(VENV) with what the demo needs (the broker's dependencies; no torch, no dev tools)"
	@if [ -f $(STAMP) ]; then $(MAKE) --no-print-directory $(STAMP); else \
	  test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) && \
	  $(BIN)/pip install --progress-bar on . ; fi
	@touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	@echo "==> make demo: checking for bubblewrap (sandbox isolation)"
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; \
	  else echo "bubblewrap is missing: sandboxes will run UNISOLATED (install bubblewrap)"; fi; }
	@PYTHONPATH=$(CURDIR) $(BIN)/python examples/demo.py

test: $(STAMP) lint unit integration

unit: $(STAMP)
	$(BIN)/pytest tests/unit -q

integration: $(STAMP)
	$(BIN)/pytest tests/integration -q -m integration

# The long API fuzzing run (the short one is part of `make integration`): more examples, stateful sequences.
fuzz: $(STAMP)
	FIREPOOL_FUZZ_EXAMPLES=$${FIREPOOL_FUZZ_EXAMPLES:-200} FIREPOOL_FUZZ_PHASES=coverage,fuzzing,stateful \
	  $(BIN)/pytest tests/integration/test_fuzz.py -q -m integration -s

lint: $(STAMP)
	$(BIN)/ruff check broker mcp_server jupyter_ext sandbox_image bench examples tests
	$(BIN)/lint-imports
	$(BIN)/mypy

bench: $(STAMP)
	for b in tracker warm-start reset late-binding gangs standby rollout mcp jupyter recovery k8s dashboard frontier fragmentation dispatch throughput; do \
	  $(BIN)/firepool bench $$b || exit 1; done
	$(BIN)/firepool bench late-binding --sim

clean:
	rm -rf $(VENV) build *.egg-info
