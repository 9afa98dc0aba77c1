"""Fixtures and hooks of the whole suite. Helpers live in :mod:`tests.support` (import them from there).

Fixtures: the shipped MNIST CNN, its data split and a bundle fitted once per run (and one of a
challenger of it); ``run_server`` (apps served in-process, stopped after the test); ``agents`` and
``module_agents`` (agents in-process or as processes, stopped after the test or the module); ``postgres``
(a database of the test's own on a server shared by the process's tests); the demo, run once per run.

Hooks: ``@pytest.mark.needs("promtool")`` probes a requirement before the test (it skips without it);
under ``CI=true`` every skip is an error naming what was missing and the ``make`` step that installs
it; ``--shuffle[=SEED]`` runs the modules, and the tests in each, in a random order.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.data.datasets import Splits
from agent.data.datasets import mnist_splits as _mnist_splits
from agent.model.classifier import OnnxClassifier, default_model_path
from tests.support.agents import Agents
from tests.support.challenger import fit_challenger_bundle
from tests.support.demo import DemoRun, run_demo
from tests.support.digits import fit_digits_logreg
from tests.support.inprocess import RunningServer, start_server
from tests.support.mnist import fit_mnist_bundle
from tests.support.once import once_per_run
from tests.support.parallel import ParallelPlan, in_background
from tests.support.postgres import PostgresDatabase, PostgresServer, fresh_database, running_postgres
from tests.support.requirements import CI, REQUIREMENTS, missing_requirements, require

# -- fixtures -----------------------------------------------------------------------------------------
#: Names of the per-test PostgreSQL databases (unique within a process; each process has its own server).
_databases = itertools.count()


@pytest.fixture(scope="session")
def mnist_model() -> OnnxClassifier:
    """The shipped MNIST CNN (input float32 [N, 1, 28, 28], pixels 0..255, 10 classes)."""
    return OnnxClassifier.load(default_model_path(), name="mnist")


@pytest.fixture(scope="session")
def mnist_splits() -> Splits:
    """MNIST-5k split into train 2,500 / validation 1,500 / test 1,000."""
    return _mnist_splits()


@pytest.fixture(scope="session")
def mnist_bundle_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """A bundle for the shipped CNN (ADI with 30 trees; IDI on ``form``), fitted once per run however
    many xdist workers share it (read-only: a test that changes a bundle copies it first)."""

    def fit(root: Path) -> dict[str, Any]:
        model, splits = request.getfixturevalue("mnist_model"), request.getfixturevalue("mnist_splits")
        return {"bundle": str(fit_mnist_bundle(root, model, splits))}

    return Path(once_per_run(tmp_path_factory, "mnist-bundle", fit)["bundle"])


@pytest.fixture(scope="session")
def digits_logreg(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A logistic regression on scikit-learn's digits as ONNX (``model``) and its bundle (``bundle``),
    made once per run (read-only); :mod:`tests.support.digits`."""
    made = once_per_run(tmp_path_factory, "digits-logreg", fit_digits_logreg)
    return {name: Path(path) for name, path in made.items()}


@pytest.fixture(scope="session")
def challenger_bundle_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """The bundle of the shipped CNN's recipe retrained on drifted data, fitted once per run as the
    challenger of the shipped CNN (``fit --champion``, :mod:`tests.support.challenger`; read-only)."""

    def fit(root: Path) -> dict[str, Any]:
        splits = request.getfixturevalue("mnist_splits")
        return {"bundle": str(fit_challenger_bundle(root, splits, default_model_path()))}

    return Path(once_per_run(tmp_path_factory, "challenger-bundle", fit)["bundle"])


@pytest.fixture
def run_server() -> Iterator[Callable[..., RunningServer]]:
    """Factory: ``run_server(app)`` starts it; every server started is stopped after the test."""
    started: list[RunningServer] = []

    def _run(app: Any, port: int | None = None) -> RunningServer:
        srv = start_server(app, port)
        started.append(srv)
        return srv

    yield _run
    for srv in reversed(started):
        srv.stop()


@pytest.fixture
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    """Agents for one test (``agents.serve(app)``, ``agents.process(config)``), stopped after it."""
    started = Agents(tmp_path_factory.mktemp)
    yield started
    started.close()


@pytest.fixture(scope="module")
def module_agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    """Agents a module's tests share (its ``agent`` fixture starts one here), stopped after its last test."""
    started = Agents(tmp_path_factory.mktemp)
    yield started
    started.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server shared by this process's tests (requirement ``postgresql``), started when
    first asked for; tests reach it through ``postgres``."""
    require("postgresql")
    with running_postgres() as server:
        yield server


@pytest.fixture
def postgres(postgres_server: PostgresServer) -> Iterator[PostgresDatabase]:
    """An empty database of the test's own on the shared server (requirement ``postgresql``), dropped
    afterwards; stopping it stops the server, started again after the test."""
    with fresh_database(postgres_server, f"t{next(_databases)}") as db:
        yield db


def _demo(factory: pytest.TempPathFactory) -> DemoRun:
    return DemoRun.from_json(once_per_run(factory, "demo", lambda root: run_demo(root).to_json()))


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """``python -m agent demo --quick --no-live`` with its state and report in a fresh directory, run
    once per run however many xdist workers read it (read-only); started in the background when the
    session begins (:mod:`tests.support.parallel`)."""
    return _demo(tmp_path_factory)


@pytest.fixture(scope="session", autouse=True)
def _demo_in_background(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The demo starts beside the suite when a collected test reads it; the session's end waits for it."""
    yield from in_background(request.session, lambda: _demo(tmp_path_factory))


# -- hooks --------------------------------------------------------------------------------------------
#: Under xdist, the controller's union of the requirements its workers found missing.
_missing_on_workers: set[str] = set()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shuffle",
        nargs="?",
        const="random",
        default=None,
        metavar="SEED",
        help="run the test modules, and the tests within each, in a random order (SEED: an integer, to repeat one)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(ParallelPlan(), "icos-parallel-plan")
    names = ", ".join(sorted(REQUIREMENTS))
    config.addinivalue_line("markers", f"needs(*names): servers or tools the test needs, of: {names}")
    worker = getattr(config, "workerinput", None)
    if worker is not None:  # an xdist worker collects in the controller's order: its seed, not one of its own
        config.option.shuffle = worker["shuffle"]
    elif config.getoption("--shuffle") == "random":
        config.option.shuffle = str(random.SystemRandom().randrange(10**6))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist's controller, for each worker it starts: the shuffle's seed (every worker must collect the
    same order)."""
    node.workerinput["shuffle"] = node.config.getoption("--shuffle")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist's controller: the requirements a worker found missing, for the summary."""
    _missing_on_workers.update(getattr(node, "workeroutput", {}).get("missing", []))


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        worker_output["missing"] = missing_requirements()


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    if config.getoption("--shuffle") is not None:
        lines.append(f"shuffled: --shuffle={config.getoption('--shuffle')} repeats this order")
    if CI:
        lines.append("CI=true: a skip is an error")
    return lines


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--shuffle``: modules in a random order, each module's tests in a random order (a module's
    tests stay together, so its module-scoped fixtures start once)."""
    seed = config.getoption("--shuffle")
    if seed is None:
        return
    rng = random.Random(int(seed))
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    groups = list(modules.values())
    rng.shuffle(groups)
    for group in groups:
        rng.shuffle(group)
    items[:] = [item for group in groups for item in group]


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in item.iter_markers("needs"):
        for name in marker.args:
            require(name)


def _as_ci_error(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Under ``CI=true`` a skip (not an xfail) becomes a failure that keeps the skip's reason."""
    if not (CI and report.skipped and not hasattr(report, "wasxfail")):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    report.outcome = "failed"
    report.longrepr = f"CI=true, where a skip is an error: {reason.removeprefix('Skipped: ')}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    _as_ci_error(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, Any]:
    report = yield
    _as_ci_error(report)
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The requirements found missing this run, each with the step that installs it; the shuffle's seed."""
    missing = sorted(set(missing_requirements()) | _missing_on_workers)
    if missing:
        terminalreporter.section("missing servers and tools")
        for line in missing:
            terminalreporter.write_line(line)
    if config.getoption("--shuffle") is not None:
        terminalreporter.write_line(f"shuffled: --shuffle={config.getoption('--shuffle')} repeats this order")
