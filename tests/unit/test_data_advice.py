"""How much labeled validation data ``fit`` asks for when the model makes few errors."""

from __future__ import annotations

import numpy as np
import pytest

from agent.estimation.calibration import EstimatorCalibration
from agent.offline.data_advice import CAP, validation_advice
from agent.offline.fit import fit_warnings


def test_enough_errors_need_no_more_data() -> None:
    advice = validation_advice(5000, 400, 0.3)  # about 120 errors in the split
    assert advice.more == 0 and advice.message() is None
    assert advice.to_dict()["needed"] <= 5000


def test_a_very_accurate_model_is_told_how_much_more() -> None:
    """12 errors of 800 (1.5%), a split of 30%: the split holds about 4 errors; ask for the data whose split
    holds 10 with 90% probability at a pessimistic (20% quantile) error rate; 3 errors of 800 ask for more
    than ten times the data: the advice is capped and says a fit on it will tell more."""
    advice = validation_advice(800, 12, 0.3)
    assert not advice.capped and advice.more > 0
    assert 14.2 / (0.3 * 0.015) < advice.needed < 10 * 800  # more than at the point estimate 12/800
    text = advice.message()
    assert text is not None and f"{advice.needed} labeled validation inputs ({advice.more} more)" in text
    few = validation_advice(800, 3, 0.3)
    assert few.capped and few.needed == CAP * 800 and "fit again" in str(few.message())


def test_no_error_seen_asks_for_a_capped_amount_and_another_fit() -> None:
    advice = validation_advice(500, 0, 0.3)
    assert advice.capped and advice.needed == CAP * 500
    text = advice.message()
    assert text is not None and "no wrong prediction" in text and "fit again" in text


def test_the_rule_gives_the_split_its_errors_in_most_fits() -> None:
    """Simulated fits of a model with a true error rate of 0.5%: a first validation set of 2,000 inputs,
    the advised size drawn again; its calibration split (30%) holds 10 errors in at least 85% of them."""
    rng = np.random.default_rng(0)
    got = []
    for k in rng.binomial(2000, 0.005, 400):
        need = max(validation_advice(2000, int(k), 0.3).needed, 2000)
        got.append(rng.binomial(round(need * 0.3), 0.005) >= 10)
    assert np.mean(got) >= 0.85


def test_fit_warns_with_the_advice() -> None:
    conf = np.linspace(0.5, 1.0, 300)
    correct = np.ones(300, dtype=bool)
    correct[:2] = False
    cal = EstimatorCalibration.fit(conf, correct, ~correct)
    warnings = fit_warnings(cal, validation_advice(1000, 7, 0.3))
    assert any("labeled validation inputs" in w for w in warnings)


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5])
def test_a_larger_calibration_fraction_needs_less_data(fraction: float) -> None:
    assert validation_advice(1000, 5, fraction).needed >= validation_advice(1000, 5, min(fraction * 1.5, 0.9)).needed
