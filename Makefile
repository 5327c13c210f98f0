# Firepool: `make demo` runs the main job on the embedded defaults, `make test` runs every test.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test unit integration lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; \
	  else echo "bubblewrap is missing: sandboxes will run UNISOLATED (install bubblewrap)"; fi; }
	$(BIN)/python examples/demo.py

test: $(STAMP) lint unit integration

unit: $(STAMP)
	$(BIN)/pytest tests/unit -q

integration: $(STAMP)
	$(BIN)/pytest tests/integration -q -m integration

lint: $(STAMP)
	$(BIN)/ruff check broker mcp_server jupyter_ext sandbox_image bench examples tests
	$(BIN)/lint-imports
	$(BIN)/mypy

bench: $(STAMP)
	for b in tracker warm-start reset late-binding gangs standby rollout mcp jupyter; do \
	  $(BIN)/firepool bench $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
