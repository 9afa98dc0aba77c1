"""``fit`` of a model over many integer values per row (token ids padded to a fixed length): the model's own
representation as the view, corrupted copies that stay valid ids and are bounded in rows, the views of the
read stage reused, a bounded PCA of wide views, and one progress bar over the whole fit."""

from __future__ import annotations

import numpy as np
import pytest

from agent.data.files import Dataset
from agent.estimation.statistics.reference import EXACT_PCA_MAX, leading_components
from agent.model.classifier import OnnxClassifier
from agent.model.view_choice import LONG_SEQUENCE, choose_view
from agent.offline.calibration.corruptions import iter_shifted_sets
from agent.offline.fit import STAGES, fit_bundle
from agent.offline.fit_progress import FitMeter, fit_meter, rows_done
from bench.fit.heavy_inputs import WIDE_CLASSES, WIDE_LENGTH, wide_token_model, wide_token_rows
from invariants.fit_params import CalibrationPlan, FitParams


@pytest.fixture(scope="module")
def wide() -> OnnxClassifier:
    return OnnxClassifier(wide_token_model(seed=0, position_width=0), name="wide")


def test_a_long_integer_vector_is_read_through_the_models_embedding(wide: OnnxClassifier) -> None:
    rows = wide_token_rows(40, seed=1)
    assert wide.signature.single is not None and wide.signature.single.shape == (WIDE_LENGTH,) > (LONG_SEQUENCE,)
    view = choose_view(wide, wide.prepare_file(rows.ids))
    assert view.kind == "embedding" and view.embedding == "hidden"
    assert "integer sequence" in view.why
    assert choose_view(wide, wide.prepare_file(rows.ids), "raw").width == WIDE_LENGTH  # still there when asked


def test_corrupted_integer_inputs_stay_integers_the_model_can_read() -> None:
    """Noise, scaling and warps of token ids are rounded and kept within what each position held in
    training, in the input's type: an id out of the embedding's table would stop the fit."""
    rng = np.random.default_rng(0)
    train = rng.integers(0, 50, (60, 30)).astype(np.int32)
    x = rng.integers(0, 50, (20, 30)).astype(np.int32)
    sets = list(iter_shifted_sets(x, (30,), train_x=train, n_sets=14, seed=0))
    assert {s.name for s in sets} >= {"audit:noise", "audit:scale", "heavy_noise"}
    for s in sets:
        assert s.x.dtype == np.int32 and s.x.shape == x.shape
        assert (s.x >= train.min(axis=0)).all() and (s.x <= train.max(axis=0)).all()
    assert any(not np.array_equal(s.x, x) for s in sets)
    floats = list(iter_shifted_sets(x.astype(np.float32), (30,), train_x=train.astype(np.float32), n_sets=2, seed=0))
    assert floats[0].x.dtype == np.float32  # other inputs are left as the corruption made them


def test_a_wide_input_is_calibrated_on_copies_bounded_in_rows(wide: OnnxClassifier) -> None:
    rows = wide_token_rows(400, seed=2)
    plan = CalibrationPlan(
        shift_windows=200, clean_windows=30, windows_per_kind=3, bootstrap=20, min_fold_rows=10, wide_rows=240
    )
    said: list[str] = []
    report = fit_bundle(
        wide,
        Dataset(rows.ids[:300], rows.y[:300]),
        Dataset(rows.ids[300:], rows.y[300:]),
        params=FitParams(n_estimators=5),
        plan=plan,
        progress=said.append,
    )
    line = next(m for m in said if "wide inputs" in m)
    kept = min(30, plan.wide_sample_rows())  # the calibration split of 100 validation rows holds 30
    assert f"{plan.wide_sets(7, kept)} copies of {kept} rows" in line
    assert plan.wide_sets(7, kept) * kept <= max(plan.wide_rows, plan.wide_min_sets * kept)
    assert report.bundle.feature_view is not None and report.bundle.feature_view["kind"] == "embedding"
    assert report.calibration.shift is not None
    assert len(report.bundle.classes) == WIDE_CLASSES


def test_the_plan_bounds_a_wide_inputs_copies() -> None:
    plan = CalibrationPlan()
    assert plan.wide_sets(7, 100) == 40 and plan.wide_sets(7, 10) == plan.sets_for(7)
    assert plan.wide_sets(7, plan.wide_sample_rows()) == plan.wide_min_sets
    assert plan.wide_sets(17, 4000) == plan.wide_min_sets


def test_leading_components_of_a_wide_view_span_the_exact_ones() -> None:
    rng = np.random.default_rng(0)
    d = EXACT_PCA_MAX + 200
    latent = rng.normal(size=(600, 5)) * np.array([9.0, 7.0, 5.0, 4.0, 3.0])
    z = latent @ rng.normal(size=(5, d)) / np.sqrt(d) + rng.normal(0, 0.05, (600, d))
    z -= z.mean(axis=0)
    fast = leading_components(z, 5)
    _, vecs = np.linalg.eigh(z.T @ z)
    exact = vecs[:, ::-1][:, :5].T
    assert fast.shape == (5, d)
    np.testing.assert_allclose(fast @ fast.T, np.eye(5), atol=1e-8)
    # the same subspace: projecting the exact directions on the fast ones keeps them whole
    np.testing.assert_allclose(np.linalg.norm(exact @ fast.T, axis=1), 1.0, atol=1e-6)


def test_one_bar_over_the_stages_moves_with_the_rows_each_announces() -> None:
    with fit_meter(STAGES, disable=True) as meter:
        assert isinstance(meter, FitMeter)
        meter.begin("read")
        meter.expect(100)
        rows_done(50)
        assert meter.done == pytest.approx(0.495)
        rows_done(500)  # more than announced: the stage's unit is never passed
        assert meter.done == pytest.approx(0.99)
        meter.end()
        meter.begin("oracle")
        rows_done(10)  # announced nothing: only its end moves the bar
        assert meter.done == pytest.approx(1.0)
        meter.end()
        assert meter.done == pytest.approx(2.0)
        for stage in STAGES[2:]:  # shares of shares add up: the bar ends at its total, never past it
            meter.begin(stage)
            meter.expect(3)
            for _ in range(3):
                rows_done(1)
            meter.end()
        assert meter.done <= len(STAGES) and meter.done == pytest.approx(len(STAGES))
    rows_done(5)  # outside a fit: nothing to move
