# icos-agent — the two commands a new user needs:
#   make demo   install into .venv and show the agent estimating accuracy on live traffic
#   make test   install what the tests need (Python packages, and system tools when run as root), run them
#               in parallel workers (PYTEST_WORKERS, default 3)
# and while working on the code:
#   make test-fast   the unit and property tests only (no servers started as processes; under 2 minutes)

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml requirements.lock | sha256sum | cut -c1-12)

# pipefail: an install that fails is not hidden by the filter that shows its progress
SHELL := bash
.SHELLFLAGS := -o pipefail -c

.PHONY: demo test test-installs test-fast lint venv spark-extra python-version system-tools mlserver-venv kserve-venv label-studio-venv nannyml-wheel grafana-typecheck bench clean audit-deps lock dist image

# First of all: an interpreter older than pyproject.toml's requires-python stops here, in one line.
python-version:
	@PYTHON=$(PYTHON) bash .ci/python-version.sh

$(BIN)/python: | python-version
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml requirements.lock | $(BIN)/python
	@echo "==> installing icos-agent and its pinned dependencies into $(VENV) (the first time takes a few minutes)"
	$(BIN)/python -m pip install -c requirements.lock -e '.[dev,demo]' \
	  | { grep --line-buffered -E '^(Collecting|Installing collected|Successfully installed)' || true; } | cut -c1-110
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

# The optional extra `icos-agent[spark]` (icos_agent.spark; its test runs Spark in local mode on the machine's Java),
# installed for the tests only: `make venv` and `make demo` stay without its download.
SPARK_STAMP := $(VENV)/.spark-$(shell cat pyproject.toml requirements.lock | sha256sum | cut -c1-12)
$(SPARK_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[spark]'
	rm -f $(VENV)/.spark-*
	touch $(SPARK_STAMP)

spark-extra: $(SPARK_STAMP)

# Debian packages the tests use: prometheus (promtool and a real server), victoria-metrics (the fleet
# evaluator's second query backend), npm (dashboard type-check),
# chromium (demo report), postgresql, openjdk-17-jre-headless (Spark's local mode); and the en_US.UTF-8 locale, without which onnxruntime cannot load
# text pipelines exported by skl2onnx (Debian's locales, then localedef). Installed only when running as
# root and missing; otherwise those tests skip with a message naming this step (under CI=true a missing
# package is an error here).
system-tools:
	@bash .ci/system-tools.sh

# Tools some tests drive, each in its own virtual environment because it pins other versions than
# the agent's (.ci/side-venv.sh: build/NAME-venv from tests/NAME/requirements.lock, rebuilt only when
# the lock changes): MLServer for the proxy-mode tests (an older FastAPI/Starlette) and KServe's gRPC
# client. An install that fails stops `make test` with pip's error.
mlserver-venv:
	@PYTHON=$(PYTHON) bash .ci/side-venv.sh mlserver "for the proxy tests" 3

kserve-venv:
	@PYTHON=$(PYTHON) bash .ci/side-venv.sh kserve "its gRPC client, for the gRPC tests" 2

label-studio-venv:
	@PYTHON=$(PYTHON) bash .ci/side-venv.sh label-studio "label-studio-sdk, for the labeling-loop test" 2

# NannyML's wheel, not installed (its dependencies pin other versions than the agent's): the synthetic car-loan data
# inside it is what the port of NannyML's quickstart reads (tests/integration/test_nannyml_quickstart.py).
nannyml-wheel: $(STAMP)
	@PYTHON=$(BIN)/python bash .ci/side-wheel.sh nannyml "its synthetic car-loan data, for the quickstart's port"

# @grafana/schema and TypeScript for the dashboard type-check (npm ci in deploy/grafana/typecheck; npm
# itself comes from system-tools).
grafana-typecheck: system-tools
	@bash .ci/grafana-typecheck.sh

demo: venv
	$(BIN)/icos-agent demo $(DEMO_ARGS)

lint: venv
	$(BIN)/ruff check agent invariants exporters tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# Parallel workers for `make test` (pytest-xdist): one more than two cores, since a test waits on the
# servers it started part of the time. --dist loadgroup: a module whose tests share a module fixture (an
# agent, MLServer, an MLflow server) runs whole on one worker, so that fixture starts once; the other
# tests are spread one by one (tests/support/parallel.py).
PYTEST_WORKERS ?= 3

# What the tests need installed. Each step is skipped when up to date (a stamp of its lock file);
# they wait on the network and run side by side, each step's output kept together.
TEST_INSTALLS := venv spark-extra system-tools mlserver-venv kserve-venv label-studio-venv nannyml-wheel grafana-typecheck
SIDE_BY_SIDE  := $(MAKE) --no-print-directory -j 8 --output-sync=target

test-installs:
	@$(SIDE_BY_SIDE) $(TEST_INSTALLS)

# Every install step and the lint first, side by side; one that fails stops here with its own error.
# Then the whole suite, with the 15 slowest tests listed at the end.
test:
	@$(SIDE_BY_SIDE) $(TEST_INSTALLS) lint
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=15 $(PYTEST_ARGS)

# Unit and property tests: what runs in-process (fewer generated examples than `make test`).
test-fast: venv
	ICOS_FUZZ_EXAMPLES=$${ICOS_FUZZ_EXAMPLES:-40} ICOS_SCHEMATHESIS_EXAMPLES=$${ICOS_SCHEMATHESIS_EXAMPLES:-8} \
	  $(BIN)/python -m pytest -q --durations=10 tests/unit tests/property $(PYTEST_ARGS)

# Known vulnerabilities of the installed dependencies (pip-audit); reports UNAVAILABLE without the service.
audit-deps: venv
	@bash .ci/audit-deps.sh

bench: venv
	$(BIN)/python -m bench $(BENCH_ARGS)

# dist/: the sdist and the wheel of icos-agent (the shipped ONNX models and the gRPC service's files
# inside), the wheel built from the sdist with the venv's setuptools: `pip install dist/icos_agent-*.whl`.
dist: venv
	$(BIN)/python .ci/dist.py dist

# The container image, from deploy/Dockerfile: the name the Helm chart (values.yaml image.repository and
# the chart's appVersion) and the manifests in deploy/kubernetes use. Push it to your registry with
# `docker tag $(IMAGE) <registry>/icos-agent:$(VERSION) && docker push <registry>/icos-agent:$(VERSION)`
# and set image.repository to <registry>/icos-agent.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE   ?= icos-agent:$(VERSION)
image:
	docker build -f deploy/Dockerfile -t $(IMAGE) .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info

# Re-pin the tested dependency versions (requirements.lock constrains every install) after changing pyproject.toml.
lock: venv
	$(BIN)/python -m pip freeze --exclude-editable | grep -v -i '^icos-agent' > requirements.lock
