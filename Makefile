# Firepool: `make demo` installs the three doors (SDK, MCP, Jupyter) and runs the main job on the embedded
# defaults; `make install` puts `firepool` on PATH; `make test-setup` then `make test` runs every test.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed
# pytest-xdist workers for `make unit` and `make integration`: 2 holds on a 2-core CI machine (integration
# tests are mostly waits on real processes); more cores may take more, e.g. `make test WORKERS=4`.
WORKERS ?= 2

.PHONY: demo install test test-setup unit integration lint bench clean fuzz

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP) $(DEMO_STAMP)

# The demo installs what the three doors need: the broker, the MCP server and the Jupyter provisioner with
# nbclient/nbconvert (`.[mcp,jupyter]`), editable (no wheel is built and copied) and without byte-compiling
# every dependency up front (Python compiles what the demo imports as it goes: 33 s -> 26 s here); no torch, no dev tools
# (`make test` installs those over it). Pip runs without -q so its progress shows.
DEMO_EXTRAS := mcp,jupyter
$(DEMO_STAMP): pyproject.toml
	@echo "==> make demo: setting up $(VENV) with the broker, MCP and Jupyter (.[$(DEMO_EXTRAS)]; no torch, no dev tools)"
	@if [ -f $(STAMP) ]; then $(MAKE) --no-print-directory $(STAMP); else \
	  { test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); \
	    echo "make demo: $(PYTHON) -m venv failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2; exit 1; }; } && \
	  $(BIN)/pip install --progress-bar on --no-compile -e '.[$(DEMO_EXTRAS)]' ; fi
	@touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	@echo "==> make demo: checking for bubblewrap (sandbox isolation)"
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; \
	  else echo "make demo: bubblewrap is missing and the broker does not start without it: install it" \
	    "(Debian/Ubuntu: sudo apt-get install bubblewrap), then make demo again" >&2; exit 1; fi; }
	@PYTHONPATH=$(CURDIR) $(BIN)/python examples/demo.py
	@# The last lines, on stderr beside make's own messages: how to type `firepool` from here on.
	@{ echo "==> firepool is installed in $(CURDIR)/$(VENV); to use it in this shell:"; \
	   echo "    source $(CURDIR)/$(BIN)/activate"; \
	   echo "==> or for every shell: make install (links firepool into ~/.local/bin)"; } >&2

# `firepool` on PATH for good: a link in ~/.local/bin to this checkout's venv (which stays where it is).
install: $(DEMO_STAMP)
	@mkdir -p "$(HOME)/.local/bin"
	@ln -sfn "$(CURDIR)/$(BIN)/firepool" "$(HOME)/.local/bin/firepool"
	@echo "==> linked $(HOME)/.local/bin/firepool -> $(CURDIR)/$(BIN)/firepool"
	@case ":$$PATH:" in *":$(HOME)/.local/bin:"*) echo "==> firepool is on your PATH: firepool --version" ;; \
	  *) echo "==> $(HOME)/.local/bin is not on your PATH; add this line to ~/.profile (or ~/.bashrc), then open a new shell:"; \
	     echo '    export PATH="$$HOME/.local/bin:$$PATH"' ;; esac

# Everything `make test` needs on a fresh Debian machine (system packages, PostgreSQL and MariaDB started with the
# tests' logins, the TypeScript MCP client, the venv): .ci/test-setup says what it does; CI runs it then `make test`.
test-setup:
	PYTHON=$(PYTHON) .ci/test-setup

test: $(STAMP) lint unit integration

unit: $(STAMP)
	$(BIN)/pytest tests/unit -q -n $(WORKERS)

integration: $(STAMP)
	$(BIN)/pytest tests/integration -q -m integration -n $(WORKERS) --dist loadfile

# The long API fuzzing run (the short one is part of `make integration`): more examples, stateful sequences.
fuzz: $(STAMP)
	FIREPOOL_FUZZ_EXAMPLES=$${FIREPOOL_FUZZ_EXAMPLES:-200} FIREPOOL_FUZZ_PHASES=coverage,fuzzing,stateful \
	  $(BIN)/pytest tests/integration/test_fuzz.py -q -m integration -s

lint: $(STAMP)
	$(BIN)/ruff check broker mcp_server jupyter_ext sandbox_image bench examples tests k8s_emulator
	$(BIN)/lint-imports
	$(BIN)/mypy

bench: $(STAMP)
	for b in tracker warm-start reset late-binding gangs standby rollout mcp jupyter recovery k8s dashboard frontier fragmentation dispatch throughput; do \
	  $(BIN)/firepool bench $$b || exit 1; done
	$(BIN)/firepool bench late-binding --sim

clean:
	rm -rf $(VENV) build *.egg-info
