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

.PHONY: demo test lint venv system-tools mlserver-venv kserve-venv bench clean audit-deps lock

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
# chromium (demo report), postgresql; and the en_US.UTF-8 locale, without which onnxruntime cannot load
# text pipelines exported by skl2onnx (Debian's locales, then localedef). Installed only when running as
# root and missing; otherwise those tests skip with a message saying how to install them.
system-tools:
	@bash .ci/system-tools.sh

# Tools some tests drive, each in its own virtual environment because it pins other versions than
# the agent's (.ci/side-venv.sh: build/NAME-venv from tests/NAME/requirements.lock, rebuilt only when
# the lock changes): MLServer for the proxy-mode tests (an older FastAPI/Starlette) and KServe's gRPC
# client. When one cannot be installed (no package index), `make test` goes on and its tests skip
# naming the target.
mlserver-venv:
	@PYTHON=$(PYTHON) bash .ci/side-venv.sh mlserver "for the proxy tests" 3

kserve-venv:
	@PYTHON=$(PYTHON) bash .ci/side-venv.sh kserve "its gRPC client, for the gRPC tests" 2

demo: venv
	$(BIN)/icos-agent demo $(DEMO_ARGS)

lint: venv
	$(BIN)/ruff check agent invariants exporters tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

test: venv system-tools lint
	@$(MAKE) --no-print-directory mlserver-venv \
	  || echo "note: MLServer could not be installed; its proxy tests skip (retry with: make mlserver-venv)" >&2
	@$(MAKE) --no-print-directory kserve-venv \
	  || echo "note: KServe's client could not be installed; its gRPC test skips (retry with: make kserve-venv)" >&2
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
