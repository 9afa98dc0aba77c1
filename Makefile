# icos-agent — the two commands a new user needs:
#   make demo   install into .venv and show the agent estimating accuracy on live traffic
#   make test   install what the tests need (Python packages, and system tools when run as root), run them

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml requirements.lock | sha256sum | cut -c1-12)

# pipefail: an install that fails is not hidden by the filter that shows its progress
SHELL := bash
.SHELLFLAGS := -o pipefail -c

.PHONY: demo test lint venv system-tools bench clean audit-deps lock

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml requirements.lock | $(BIN)/python
	@echo "==> installing icos-agent and its pinned dependencies into $(VENV) (the first time takes a few minutes)"
	$(BIN)/python -m pip install -c requirements.lock -e '.[dev,demo]' \
	  | { grep --line-buffered -E '^(Collecting|Installing collected|Successfully installed)' || true; } | cut -c1-110
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

# Debian packages the tests use: prometheus (promtool and a real server), npm (dashboard type-check),
# chromium (demo report). Installed only when running as root and missing; otherwise those tests skip
# with a message saying how to install them.
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

# Re-pin the tested dependency versions (requirements.lock constrains every install) after changing pyproject.toml.
lock: venv
	$(BIN)/python -m pip freeze --exclude-editable | grep -v -i '^icos-agent' > requirements.lock
