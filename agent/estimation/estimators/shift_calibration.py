"""What ``shift_aware`` learns at ``fit`` (stored in the bundle, JSON-able): regressions from window features to
accuracy, their interval bins and the reference the window is compared with. It is the estimators' own part of
the bundle's calibration (:class:`agent.estimation.calibration.EstimatorCalibration` holds it), fitted by
:func:`agent.offline.calibration.estimators.shift_fitting.fit_shift_calibration`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.estimation.estimators.tree_ensemble import TreeEnsemble
from agent.estimation.estimators.trust import TrustModel
from agent.estimation.layout import MEAN_CONFIDENCE
from agent.estimation.statistics.reference import InputReference

#: What the ``shift_aware`` regressions may predict (see :class:`ShiftCalibration`).
SHIFT_TARGETS = ("residual", "accuracy")
#: Format tag of the ``shift`` entry; entries of another format (older bundles) are ignored.
SHIFT_FORMAT = "window_regression_v2"


@dataclass(frozen=True)
class ShiftCalibration:
    """What ``shift_aware`` learns at fit time (JSON-able through :meth:`to_dict`).

    ``full``/``inputs``/``reduced``: gradient-boosted regressions from window features
    (:data:`FULL_FEATURES`, :data:`INPUTS_FEATURES`, :data:`REDUCED_FEATURES`) to accuracy; ``q_edges``:
    edges of bins of the predicted accuracy; ``q_full``/``q_inputs``/``q_reduced``: per bin, the 95%
    quantile of the absolute error of the model in
    leave-families-out validation (the half-width of the interval before sampling noise);
    ``reference``: the inputs and TDI leaves the window is compared with; ``families``: the
    corruption families used; ``lofo_mae``: the full model's mean absolute error out of family;
    ``target``: what the regressions predict, ``"residual"`` (accuracy minus the window's mean
    confidence, see :func:`fit_shift_calibration`) or ``"accuracy"`` (bundles fitted before the
    residual target); ``trust``: where the calibration windows lie, for the trust distance and the
    shrinkage toward the confidence estimate (:mod:`agent.estimation.estimators.trust`; None in bundles fitted
    before it: the learnt estimate is then used as it is).
    """

    full: TreeEnsemble
    inputs: TreeEnsemble
    reduced: TreeEnsemble
    q_edges: tuple[float, ...]
    q_full: tuple[float, ...]
    q_inputs: tuple[float, ...]
    q_reduced: tuple[float, ...]
    reference: InputReference
    families: tuple[str, ...] = ()
    lofo_mae: float = 0.0
    target: str = "residual"
    trust: TrustModel | None = None

    def predict(self, kind: str, x: np.ndarray) -> np.ndarray:
        """The predicted accuracy (unclipped) of windows with features ``x`` (``[F]`` or ``[N, F]``)
        by the ``kind`` model (``full``, ``inputs`` or ``reduced``)."""
        x2 = np.atleast_2d(np.asarray(x, dtype=np.float64))
        model = {"full": self.full, "inputs": self.inputs, "reduced": self.reduced}[kind]
        out = model.predict(x2)
        return out + x2[:, MEAN_CONFIDENCE] if self.target == "residual" else out

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": SHIFT_FORMAT,
            "full": self.full.to_dict(),
            "inputs": self.inputs.to_dict(),
            "reduced": self.reduced.to_dict(),
            "q_edges": list(self.q_edges),
            "q_full": list(self.q_full),
            "q_inputs": list(self.q_inputs),
            "q_reduced": list(self.q_reduced),
            "reference": self.reference.to_dict(),
            "families": list(self.families),
            "lofo_mae": self.lofo_mae,
            "target": self.target,
            **({"trust": self.trust.to_dict()} if self.trust is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ShiftCalibration:
        if d.get("kind") != SHIFT_FORMAT:
            raise ValueError("shift calibration of an older format (refit the bundle)")
        out = cls(
            full=TreeEnsemble.from_dict(d["full"]),
            inputs=TreeEnsemble.from_dict(d["inputs"]),
            reduced=TreeEnsemble.from_dict(d["reduced"]),
            q_edges=tuple(float(v) for v in d["q_edges"]),
            q_full=tuple(float(v) for v in d["q_full"]),
            q_inputs=tuple(float(v) for v in d["q_inputs"]),
            q_reduced=tuple(float(v) for v in d["q_reduced"]),
            reference=InputReference.from_dict(d["reference"]),
            families=tuple(str(v) for v in d.get("families", ())),
            lofo_mae=float(d.get("lofo_mae", 0.0)),
            target=str(d.get("target", "accuracy")),
            trust=TrustModel.from_dict(d["trust"]) if d.get("trust") else None,
        )
        if out.target not in SHIFT_TARGETS:
            raise ValueError(f"unknown shift calibration target {out.target!r}; expected one of {SHIFT_TARGETS}")
        if any(len(q) != len(out.q_edges) + 1 for q in (out.q_full, out.q_inputs, out.q_reduced)):
            raise ValueError("shift calibration has the wrong number of interval bins")
        return out
