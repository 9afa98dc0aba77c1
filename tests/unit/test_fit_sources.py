"""Every fit source meets the same contract (:class:`agent.offline.fit_source.FitSource`): its read gives the
oracle's data the stages read, consistent in rows and classes; it says whether a champion is paired; its
correctness figures cover its training and validation rows. And the stage loop runs a declared sequence in
order, timing every stage by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.data.files import Dataset
from agent.data.tables import TableBatch, TableColumns
from agent.model.classifier import OnnxClassifier
from agent.offline.fit_progress import fit_meter
from agent.offline.fit_source import FitSource
from agent.offline.fit_source_model import ModelFitSource
from agent.offline.fit_source_table import TableFitSource
from agent.offline.fit_stages import FIT_STAGES, PAIRED_STAGES, stages_of
from agent.offline.stage_loop import Stages
from invariants.fit_params import FitParams


def _model_source(tmp_path: Path) -> ModelFitSource:
    from skl2onnx import to_onnx
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    x, y = make_classification(n_samples=300, n_features=5, n_informative=3, random_state=1)
    x = x.astype(np.float32)
    clf = LogisticRegression().fit(x, y)
    exported = to_onnx(clf, x[:1], options={id(clf): {"zipmap": False}}, target_opset={"": 17, "ai.onnx.ml": 3})
    (tmp_path / "m.onnx").write_bytes(exported.SerializeToString())
    model = OnnxClassifier.load(tmp_path / "m.onnx")
    return ModelFitSource(model, Dataset(x[:200], y[:200]), Dataset(x[200:], y[200:]), params=FitParams(seed=2))


def _table_source(tmp_path: Path) -> TableFitSource:
    rng = np.random.default_rng(4)
    x = rng.normal(size=(300, 3))
    p1 = 1 / (1 + np.exp(-x[:, 0]))
    y = (rng.uniform(size=300) < p1).astype(int)
    ref = TableBatch(x, np.stack([1 - p1, p1], axis=1), y, {})
    return TableFitSource(ref, TableColumns(("p1",), ("a", "b", "c"), "y"), ["0", "1"], params=FitParams(seed=2))


@pytest.mark.parametrize("make", [_model_source, _table_source], ids=["model", "table"])
def test_every_source_reads_the_oracles_data_and_its_figures(make: Any, tmp_path: Path) -> None:
    source: FitSource[Any] = make(tmp_path)
    data = source.read(lambda _m: None)
    od = data.oracle_data
    n_train, n_val = len(od.train_y), len(od.val_y)
    assert n_train > 0 and n_val > 0
    assert od.train_features.shape[0] == n_train and od.val_features.shape[0] == n_val
    assert od.val_probabilities.shape == (n_val, len(od.classes)) and len(od.val_predicted) == n_val
    train_correct, val_correct = source.correct(data)
    assert len(train_correct) == n_train and len(val_correct) == n_val
    assert not source.pairs and stages_of(source) is FIT_STAGES


def test_a_champion_adds_the_pair_stage_last(tmp_path: Path) -> None:
    source = _table_source(tmp_path)
    paired = TableFitSource(source.ref, source.columns, source.classes, champion_probabilities=source.ref.probabilities)
    assert paired.pairs and stages_of(paired) is PAIRED_STAGES
    assert PAIRED_STAGES.names == (*FIT_STAGES.names, "pair")
    assert FIT_STAGES.names == ("read", "oracle", "calibrate", "segments", "headline", "flag", "write")


def test_the_stage_loop_runs_the_declared_stages_in_order_and_times_each() -> None:
    seen: list[str] = []

    def first(source: str, _: None, say: Any) -> int:
        seen.append("first")
        return len(source)

    def double(source: str, n: int, say: Any) -> int:
        seen.append("double")
        return 2 * n

    def named(source: str, n: int, say: Any) -> str:
        seen.append("named")
        return f"{source}:{n}"

    stages = Stages.first("first", first).then("double", double).then("named", named)
    with fit_meter(stages.names, disable=True) as meter:
        out, seconds = stages.run("abc", lambda _m: None, meter)
    assert out == "abc:6" and seen == ["first", "double", "named"]
    assert list(seconds) == ["first", "double", "named"] and all(s >= 0 for s in seconds.values())
    assert meter.done == pytest.approx(3)
