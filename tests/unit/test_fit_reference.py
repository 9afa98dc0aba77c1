"""``icos_agent.fit_reference``: a bundle fitted from logged predictions (features, predicted probabilities,
labels) in a data frame, estimated over data frames of logged rows — in batches of any size the same, per window
of time with the realized accuracy beside, read back by ``load`` without a model — and the mistakes it names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import icos_agent
from agent.errors import UserError
from invariants.fit_params import CalibrationPlan
from tests.support.estimates import assert_same_estimates

PLAN = CalibrationPlan(shift_windows=300, clean_windows=40, windows_per_kind=3, bootstrap=20, min_fold_rows=20)


def _logged(n: int, seed: int, shift: float = 0.0) -> pd.DataFrame:
    """A binary model's logged rows: three features, the probability of class 1, the label, an id and a time."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)) + shift
    p1 = 1.0 / (1.0 + np.exp(-(1.5 * x[:, 0] - x[:, 1])))
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(1.5 * x[:, 0] - x[:, 1] + 0.8 * x[:, 2])))).astype(int)
    frame = pd.DataFrame(x, columns=["a", "b", "c"]).assign(p1=p1.round(4), label=y, id=np.arange(n))
    frame["y_pred"] = (frame["p1"] >= 0.5).astype(int)
    frame["ts"] = pd.Timestamp("2026-04-01", tz="UTC") + pd.to_timedelta(np.arange(n) * 7, unit="s")
    frame["city"] = "x"  # not numeric: left out of the features
    return frame


@pytest.fixture(scope="module")
def bundle() -> icos_agent.Bundle:
    ref = _logged(1500, 1)
    return icos_agent.fit_reference(
        ref.drop(columns=["ts"]),
        label_column="label",
        proba_columns=["p1"],
        exclude=["id", "y_pred"],
        trees=10,
        plan=PLAN,
        progress=False,
    )


def test_the_features_are_the_numeric_columns_left(bundle: icos_agent.Bundle) -> None:
    assert bundle.model is None and bundle.classes == ["0", "1"]
    table = bundle.invariants.table
    assert table is not None
    assert (table.proba_columns, table.feature_columns) == (("p1",), ("a", "b", "c"))


def test_estimates_do_not_depend_on_batches_and_load_reads_it_back(bundle: icos_agent.Bundle, tmp_path: Path) -> None:
    live = _logged(2000, 2, shift=0.4)
    whole = bundle.estimate(live, timestamp="ts", window="1h", labels="label")
    df = whole.to_df()
    assert df["n"].sum() == 2000 and len(df) == 4
    assert df["realized"].notna().all()
    parts = (live.iloc[i : i + 333] for i in range(0, 2000, 333))
    assert_same_estimates(whole, bundle.estimate(parts, timestamp="ts", window="1h", labels="label", batch_rows=100))
    bundle.save(tmp_path / "b")
    again = icos_agent.load(tmp_path / "b").estimate(live, timestamp="ts", window="1h", labels="label")
    assert_same_estimates(whole, again)


def test_mistakes_are_named(bundle: icos_agent.Bundle, tmp_path: Path, digits_logreg: dict[str, Path]) -> None:
    ref = _logged(200, 3)
    with pytest.raises(UserError, match="label column"):
        icos_agent.fit_reference(ref, proba_columns=["p1"])
    with pytest.raises(UserError, match="probability column"):
        icos_agent.fit_reference((ref, "label"), proba_columns=[])
    with pytest.raises(UserError, match="unknown option"):
        icos_agent.fit_reference((ref, "label"), proba_columns=["p1"], tres=3)
    with pytest.raises(UserError, match="reads data frames"):
        bundle.estimate(np.zeros((3, 3)))
    with pytest.raises(UserError, match="not found: p1"):
        bundle.estimate(ref.drop(columns=["p1"]))
    with pytest.raises(UserError, match="challenger"):
        bundle.estimate(ref, challenger=bundle)
    with pytest.raises(UserError, match="give model="):
        icos_agent.load(digits_logreg["bundle"])
    bundle.save(tmp_path / "b")
    from icos_agent.spark import estimate

    with pytest.raises(UserError, match="no row order"):  # Spark reads such a bundle's logged rows, by time only
        estimate(object(), bundle, window=100)  # type: ignore[arg-type]
