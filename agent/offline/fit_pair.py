"""The ``pair`` stage of a challenger's ``fit`` (``fit --champion CHAMPION.onnx``, or from a table
``fit --reference ... --champion-proba-columns ...``): the challenger's comparison with the champion
calibrated (:mod:`agent.offline.calibration.pairs.fitting`) and recorded in the challenger's bundle, so that an
agent serving the champion can run the challenger beside it (``challenger:`` settings) and ``check
--challenger`` can compare them offline."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from agent.data.tables import TableBatch
from agent.estimation.pairs.calibration import PairCalibration
from agent.model.classifier import OnnxClassifier, predicted_classes_of
from agent.model.inputs import Inputs
from agent.offline.calibration.pairs.fitting import PairedSet, fit_pair, paired_sets
from agent.offline.viewing import LazySource, subset
from invariants.fit_params import CalibrationPlan, FitParams

Progress = Callable[[str], None]


def _in_memory(x: Inputs | LazySource, k: int, rng: np.random.Generator) -> tuple[Inputs, np.ndarray]:
    """``x`` itself, or at most ``k`` of its rows when it is read from files, and the rows taken."""
    if isinstance(x, Inputs):
        return x, np.arange(x.n)
    rows = subset(x.n, k, rng)
    return x.take(rows), rows


def pair_of_model(
    model: OnnxClassifier,
    champion: OnnxClassifier,
    val_x: Inputs | LazySource,
    train_x: Inputs | LazySource,
    val_y: np.ndarray,
    params: FitParams,
    plan: CalibrationPlan,
    say: Progress,
) -> PairCalibration:
    """Both models on the validation split and its corrupted copies (image files: a sample of both sets, as
    ``shift_aware``'s calibration takes), the pair fitted on them; ``model`` reads the fit's view and
    threshold, ``val_y`` are the validation set's class indices."""
    rng = np.random.default_rng(params.seed)
    val_in, rows = _in_memory(val_x, plan.lazy_calibration, rng)
    train_in, _ = _in_memory(train_x, plan.lazy_train_sample, rng)
    say(f"calibrating the comparison with the champion on {len(rows)} validation rows and corrupted copies")
    clean, copies = paired_sets(
        champion,
        model,
        val_in,
        val_y[rows],
        train_in,
        n_sets=params.shift_sets,
        seed=params.seed,
    )
    shifted = list(copies)
    pair = fit_pair(clean, shifted, seed=params.seed, plan=plan, champion_sha256=champion.sha256)
    say(
        f"champion comparison: the versions disagree on {pair.disagreement_rate:.1%} of validation rows; "
        f"model error by disagreement rate {[round(e, 3) for e in pair.error]}"
    )
    return pair


def pair_of_table(
    ref: TableBatch,
    champion_probabilities: np.ndarray,
    y: np.ndarray,
    params: FitParams,
    plan: CalibrationPlan = CalibrationPlan(),
) -> PairCalibration:
    """A pair known by a reference table's two sets of probability columns (no model to corrupt inputs
    for): calibrated on its rows alone (``corrupted_sets == 0``)."""
    predicted = predicted_classes_of(ref.probabilities, params.decision_threshold)
    clean = PairedSet.of("clean", champion_probabilities, ref.probabilities, y, label_b=predicted)
    return fit_pair(clean, [], seed=params.seed, plan=plan)
