"""Fixtures and hooks of the whole suite. Helpers live in :mod:`tests.support` (import them from there).

Fixtures: the shipped MNIST CNN, its data split and a bundle fitted once per session (and one of a
challenger of it); ``run_server``
(agents served in-process, stopped after the test); ``postgres`` (a server of the test's own); the
demo, run once per session.

Hooks: ``@pytest.mark.needs("promtool")`` probes a requirement before the test (it skips without it);
under ``CI=true`` every skip is an error naming what was missing and the ``make`` step that installs
it; ``--shuffle[=SEED]`` runs the modules, and the tests in each, in a random order.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.data.datasets import Splits
from agent.data.datasets import mnist_splits as _mnist_splits
from agent.model.classifier import OnnxClassifier, default_model_path
from tests.support.challenger import fit_challenger_bundle
from tests.support.demo import DemoRun, run_demo
from tests.support.inprocess import RunningServer, start_server
from tests.support.mnist import fit_mnist_bundle
from tests.support.postgres import PostgresServer, running_postgres
from tests.support.requirements import CI, REQUIREMENTS, missing_requirements, require


# -- fixtures -----------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def mnist_model() -> OnnxClassifier:
    """The shipped MNIST CNN (input float32 [N, 1, 28, 28], pixels 0..255, 10 classes)."""
    return OnnxClassifier.load(default_model_path(), name="mnist")


@pytest.fixture(scope="session")
def mnist_splits() -> Splits:
    """MNIST-5k split into train 2,500 / validation 1,500 / test 1,000."""
    return _mnist_splits()


@pytest.fixture(scope="session")
def mnist_bundle_dir(
    tmp_path_factory: pytest.TempPathFactory, mnist_model: OnnxClassifier, mnist_splits: Splits
) -> Path:
    """A bundle fitted once per session for the shipped CNN (ADI with 30 trees; IDI on ``form``)."""
    return fit_mnist_bundle(tmp_path_factory.mktemp("mnist-bundle"), mnist_model, mnist_splits)


@pytest.fixture(scope="session")
def challenger_bundle_dir(tmp_path_factory: pytest.TempPathFactory, mnist_splits: Splits) -> Path:
    """The bundle of the shipped CNN's recipe retrained on drifted data, fitted once per session as the
    challenger of the shipped CNN (``fit --champion``, :mod:`tests.support.challenger`)."""
    return fit_challenger_bundle(tmp_path_factory.mktemp("challenger-bundle"), mnist_splits, default_model_path())


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
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test's own (requirement ``postgresql``)."""
    require("postgresql")
    with running_postgres() as server:
        yield server


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """``python -m agent demo --quick --no-live`` with its state and report in a fresh directory."""
    return run_demo(tmp_path_factory.mktemp("demo"))


# -- hooks --------------------------------------------------------------------------------------------
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
    names = ", ".join(sorted(REQUIREMENTS))
    config.addinivalue_line("markers", f"needs(*names): servers or tools the test needs, of: {names}")
    seed = config.getoption("--shuffle")
    if seed == "random":
        config.option.shuffle = str(random.SystemRandom().randrange(10**6))


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
    missing = missing_requirements()
    if missing:
        terminalreporter.section("missing servers and tools")
        for line in missing:
            terminalreporter.write_line(line)
    if config.getoption("--shuffle") is not None:
        terminalreporter.write_line(f"shuffled: --shuffle={config.getoption('--shuffle')} repeats this order")
