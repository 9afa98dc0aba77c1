"""How the suite shares two cores among pytest-xdist workers (``make test``: ``-n 4 --dist loadgroup``),
a pytest plugin the conftest registers.

* A module whose tests share a module- or class-scoped fixture (an agent, MLServer, an MLflow server,
  a fitted bundle) runs whole on one worker, so that fixture starts once; so do the tests of an
  ``xdist_group`` mark. The other tests are spread one by one, so that no long module holds the run's
  end. (xdist's own ``loadgroup`` renames the tests by their group, which pytest 9 no longer allows:
  here the workers write each test's group to a file that the controller's scheduler reads.)
* The demo (``demo_run``, a few minutes) starts in a thread of each worker's session (the first one
  makes it, the others wait for it, :mod:`tests.support.once`) beside the rest of the suite, and the
  tests that read it run last (unless ``--shuffle``): no worker sits waiting for it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

#: Fixture scopes that a module's tests share: such a module stays on one worker.
SHARED_SCOPES = {"module", "class", "package"}
#: The fixture whose tests run last (what it makes starts in the background instead).
BACKGROUND_FIXTURE = "demo_run"
_GROUPS_KEY = "icos_groups_file"


def group_of(item: pytest.Item) -> str | None:
    """The worker group of ``item``: its ``xdist_group`` mark, else its module when it uses a fixture that
    lives longer than a test and shorter than the session, else none (it may run anywhere)."""
    marks = sorted(
        str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")
    )
    if marks:
        return "_".join(marks)
    info = getattr(item, "_fixtureinfo", None)
    if info is not None and any(defs and defs[-1].scope in SHARED_SCOPES for defs in info.name2fixturedefs.values()):
        return item.nodeid.split("::", 1)[0]
    return None


class ParallelPlan:
    """The plugin, in the controller and in every worker."""

    def __init__(self) -> None:
        self._groups_dir: Path | None = None

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if config.getoption("--shuffle") is None:
            items.sort(key=lambda item: BACKGROUND_FIXTURE in getattr(item, "fixturenames", ()))
        worker = getattr(config, "workerinput", None)
        if worker is not None and _GROUPS_KEY in worker:
            groups = {item.nodeid: group for item in items if (group := group_of(item)) is not None}
            target = Path(worker[_GROUPS_KEY])
            part = target.with_name(f"{target.name}.{worker['workerid']}")
            part.write_text(json.dumps(groups), encoding="utf-8")
            os.replace(part, target)  # every worker writes the same mapping; a reader sees a whole one

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        if node.config.getvalue("dist") == "loadgroup":
            if self._groups_dir is None:
                self._groups_dir = Path(tempfile.mkdtemp(prefix="icos-xdist-groups-"))
            node.workerinput[_GROUPS_KEY] = str(self._groups_dir / "groups.json")

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") != "loadgroup" or self._groups_dir is None:
            return None
        return _module_group_scheduling(config, log, self._groups_dir / "groups.json")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._groups_dir is not None:
            shutil.rmtree(self._groups_dir, ignore_errors=True)


def _module_group_scheduling(config: pytest.Config, log: Any, groups_file: Path) -> Any:
    """xdist's ``loadgroup`` scheduler whose groups come from ``groups_file`` (written by the workers
    before they report their collection, so complete when the scheduler first splits)."""
    from xdist.scheduler import LoadGroupScheduling

    class ModuleGroupScheduling(LoadGroupScheduling):  # type: ignore[misc]
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = json.loads(groups_file.read_text(encoding="utf-8")) if groups_file.exists() else {}
            group = self.groups.get(nodeid)
            return group if group is not None else str(super()._split_scope(nodeid))

    return ModuleGroupScheduling(config, log)


def in_background(session: pytest.Session, start: Callable[[], Any]) -> Iterator[None]:
    """Run ``start()`` in a thread while the session's tests run, when a collected test uses
    :data:`BACKGROUND_FIXTURE`; at the session's end wait for it (it bounds itself). An exception in the
    thread is dropped: the fixture, asked again, makes it in the test and fails there with its own error."""
    if not any(BACKGROUND_FIXTURE in getattr(item, "fixturenames", ()) for item in session.items):
        yield
        return

    def run() -> None:
        try:
            start()
        except Exception:  # noqa: BLE001, S110 - the test that needs it makes it again and reports the error
            pass

    thread = threading.Thread(target=run, name="icos-demo-background", daemon=True)
    thread.start()
    yield
    thread.join()
