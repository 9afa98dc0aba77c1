"""The contract every registered segment kind meets, the same checks for each (scikit-learn's
``check_estimator`` idea): adding a kind is one module under agent/estimation/segments/kinds/, one under
agent/offline/calibration/segments/kinds/, one entry in each registry, and passing this file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agent.estimation.segments.kinds.registry import KINDS
from agent.estimation.segments.segmentation import Dimension
from agent.offline.calibration.segments.data import ColumnGroup, SegmentData, ViewShape
from agent.offline.calibration.segments.kinds.registry import FITS
from invariants.fit_params import CalibrationPlan
from invariants.tdi import TrainingInvariants

CLASSES = ("no", "yes", "maybe")
NAMES = ["color=red", "color=green", "color=blue", "color=(other)", "size", "code"]
#: A table view that is also cut by regions, so that every kind has something to cut.
SHAPE = ViewShape(
    (ColumnGroup("color", (0, 1, 2, 3), ("red", "green", "blue", "(other)")), ColumnGroup("size", (4,))),
    regions=True,
)


def table(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    color = rng.integers(0, 3, n)
    x = np.zeros((n, 6), dtype=np.float32)
    x[np.arange(n), color] = 1.0
    x[:, 4] = rng.normal(0, 1, n)
    x[:, 5] = rng.integers(0, 3, n)
    return x, np.where(x[:, 4] > 0.8, 2, color % 2).astype(np.int64)


@pytest.fixture(scope="module")
def data() -> SegmentData:
    rng = np.random.default_rng(0)
    train_x, train_y = table(1500, rng)
    val_x, val_y = table(900, rng)
    predicted = np.where(rng.uniform(size=len(val_y)) < 0.8, val_y, (val_y + 1) % 3)
    probs = np.full((len(val_y), 3), 0.1)
    probs[np.arange(len(val_y)), predicted] = 0.8
    cal_index = np.arange(0, len(val_y), 3)
    verdicts = np.zeros(len(cal_index), dtype=np.int8)
    tdi = TrainingInvariants.fit(train_x, train_y, feature_names=NAMES)
    return SegmentData(train_x, train_y, val_x, val_y, probs, predicted, cal_index, verdicts, tdi, CLASSES)


def inputs(data: SegmentData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    assert data.tdi is not None
    return data.val_features, data.val_predicted, data.tdi.rule_index(data.val_features)


def defined(name: str, data: SegmentData, budget: int = 64) -> list[Dimension]:
    dims = FITS[name].define(data, SHAPE, CalibrationPlan(), budget, 0)
    assert dims, f"{name}: nothing defined on a view every kind can cut"
    return dims


def test_every_kind_has_a_fit_part_of_its_name_and_the_fit_parts_none_other() -> None:
    assert set(FITS) == set(KINDS)
    for name, fit in FITS.items():
        assert fit.name == name and isinstance(KINDS[name], fit.kind)


@pytest.mark.parametrize("name", list(KINDS))
def test_a_kinds_dimensions_read_every_prediction_into_one_of_their_segments(name: str, data: SegmentData) -> None:
    kind = KINDS[name]
    for dim in defined(name, data):
        assert dim.kind == name and dim.source in kind.sources and len(dim.segments) >= 2
        ids = dim.local_ids(*inputs(data))
        assert ids is not None and ids.shape == (len(data.val_y),)
        assert np.issubdtype(ids.dtype, np.integer) and ids.min() >= 0 and ids.max() < len(dim.segments)


@pytest.mark.parametrize("name", list(KINDS))
def test_a_kinds_dimensions_survive_the_bundle_and_count_the_same(name: str, data: SegmentData) -> None:
    for dim in defined(name, data):
        again = Dimension.from_dict(json.loads(json.dumps(dim.to_dict())))
        assert again == dim
        np.testing.assert_array_equal(again.local_ids(*inputs(data)), dim.local_ids(*inputs(data)))


@pytest.mark.parametrize("name", list(KINDS))
def test_a_kinds_dimensions_say_none_when_what_they_read_is_missing(name: str, data: SegmentData) -> None:
    features, predicted, rules = inputs(data)
    for dim in defined(name, data):
        assert dim.local_ids(None, None, None) is None
        if dim.width:
            assert dim.local_ids(features[:, : dim.width - 1], predicted, rules) is None


#: Kinds whose dimensions are taken whole or not at all are left out: define_segments checks their budget.
@pytest.mark.parametrize("name", [name for name in KINDS if not FITS[name].whole])
def test_a_kind_fitted_to_a_small_budget_keeps_to_it(name: str, data: SegmentData) -> None:
    for dim in FITS[name].define(data, SHAPE, CalibrationPlan(), 3, 0):
        assert len(dim.segments) <= 3


@pytest.mark.parametrize("name", list(KINDS))
def test_a_kind_refuses_a_source_it_does_not_read(name: str, data: SegmentData) -> None:
    dim = defined(name, data)[0]
    other = next(s for k in KINDS.values() for s in k.sources if s not in KINDS[name].sources)
    with pytest.raises(ValueError, match="source"):
        Dimension.from_dict({**dim.to_dict(), "source": other})
