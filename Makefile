# icos-agent — the two commands a new user needs:
#   make demo   install into .venv and show the agent estimating accuracy on live traffic
#   make test   install what the tests need (Python packages, and system tools when run as root), run them

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
SYSTEM_STAMP := $(VENV)/.system-tools

.PHONY: demo test lint venv system-tools bench clean audit-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,demo]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

# Debian packages the integration tests use: prometheus (promtool and a real server).
# Installed only when running as root and missing; otherwise those tests skip with a message.
system-tools:
	@bash .ci/system-tools.sh

demo: venv
	$(BIN)/icos-agent demo $(DEMO_ARGS)

lint: venv
	$(BIN)/ruff check agent invariants exporters tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

test: venv system-tools lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Known vulnerabilities of the installed dependencies (pip-audit); reports UNAVAILABLE without the service.
audit-deps: venv
	@bash .ci/audit-deps.sh

bench: venv
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
