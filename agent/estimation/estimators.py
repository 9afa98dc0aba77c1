"""Operational-accuracy estimators computed from unlabeled predictions.

Every estimator works on a small set of sufficient statistics (:class:`WindowStats`) so that the
same code serves a batch (``icos-agent check``) and streaming windows (the sidecar), where stats of
arriving predictions are added and those of expiring ones subtracted.

Estimators:

``icos``
    1 − share of predictions the oracle fails (ICOS paper §5.3: the estimated accuracy is the share of
    ``pass`` verdicts). Wilson 95% interval on the pass share.
``icos_corrected``
    Rogan–Gladen correction of the fail share with the oracle's TPR and FPR measured on a calibration
    split held out of ADI training: with fail share ``r``, accuracy = (TPR − r) / (TPR − FPR), clipped
    to [0, 1]. 95% interval by the delta method with the binomial variances of ``r``, TPR and FPR.
``avg_conf``
    Mean top-class probability. Normal interval on the mean.
``atc``
    Average Thresholded Confidence (Garg et al., ICLR 2022): a threshold ``t`` on the top-class
    probability is chosen on the calibration split so that the share of samples above ``t`` equals
    the calibration accuracy; the estimate is the live share above ``t``. Wilson interval.
``doc``
    Difference of Confidences (Guillory et al., 2021): calibration accuracy shifted by the change of
    average confidence between calibration and live data. Interval of ``avg_conf`` shifted.
``shift_aware`` (the recommended, headline estimator)
    A regression from label-free statistics of the whole window (confidence histogram, oracle
    verdict shares, agreement with the TDI leaves and leaf distance, input PCA error, margin, the mix
    of predicted classes) to its accuracy, learnt at fit time on windows of corrupted copies of the
    calibration split (a generic family of corruptions and the metamorphic audit's transformations,
    see :mod:`agent.estimation.shifts`). The forests predict the *residual* accuracy minus mean
    confidence, so the estimate is the mean confidence corrected by what similar calibration windows
    showed (the AutoEval-style regression of Deng & Zheng, CVPR 2021, on a confidence baseline). Three
    gradient-boosted forests serve windows with all per-sample inputs (``full``), without the
    predicted labels (``inputs``) and without any per-sample input (``reduced``). The 95% interval
    combines the forest's out-of-family error (95% quantile per level of predicted accuracy, from
    holding corruption families out) with the sampling noise. Everything comes from additive counts
    (:class:`WindowStats`), so it works on streaming windows. Without a shift calibration of the
    current format in the bundle (old bundles) the estimator is absent.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from agent.estimation.tree_ensemble import TreeEnsemble

Z95 = 1.959963984540054

ESTIMATORS: tuple[str, ...] = ("icos", "icos_corrected", "avg_conf", "atc", "doc", "shift_aware")
#: The recommended estimator (shown first in reports and dashboards).
RECOMMENDED_ESTIMATOR = "shift_aware"

#: Inner edges of the top-class-probability bins used by ``shift_aware`` (6 bins).
CONF_EDGES: tuple[float, ...] = (0.6, 0.8, 0.9, 0.97, 0.995)
N_CONF_BINS = len(CONF_EDGES) + 1
#: Verdict groups (indices of ``invariants.oracle.VERDICTS``: pass, fail:idi, fail:tdi, fail:adi).
N_VERDICTS = 4
N_CELLS = N_VERDICTS * N_CONF_BINS


def conf_bins(confidences: np.ndarray) -> np.ndarray:
    """Bin index (0..5) of each top-class probability (bins split at :data:`CONF_EDGES`)."""
    return np.searchsorted(np.asarray(CONF_EDGES), np.asarray(confidences, dtype=np.float64), side="right")


def cell_index(verdicts: np.ndarray, confidences: np.ndarray) -> np.ndarray:
    """Cell of each sample: ``verdict * N_CONF_BINS + confidence bin``."""
    v = _clip_index(np.asarray(verdicts, dtype=np.int64), N_VERDICTS)
    return v * N_CONF_BINS + conf_bins(confidences)


def cell_counts(verdicts: np.ndarray, confidences: np.ndarray) -> list[int]:
    """Number of samples per cell (length :data:`N_CELLS`)."""
    idx = cell_index(verdicts, confidences)
    return list(np.bincount(idx, minlength=N_CELLS)[:N_CELLS].tolist())


def _clip_index(a: np.ndarray, size: int) -> np.ndarray:
    """``a`` clipped to ``0 .. size − 1`` (two ufunc calls; ``np.clip``'s wrapper costs more than the
    work on a request-sized batch)."""
    return np.minimum(np.maximum(a, 0), size - 1)


#: Bins of the window's mean PCA reconstruction error, as quantiles of the clean calibration split.
PCA_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)
N_PCA_BINS = len(PCA_QUANTILES) + 1
#: Samples per step of :meth:`InputReference.pca_error` (its float64 buffer stays in the CPU cache).
PCA_CHUNK = 64
#: Window features of the reduced model (computable from verdicts and confidences alone).
REDUCED_FEATURES: tuple[str, ...] = (
    *(f"conf_bin_{i}" for i in range(N_CONF_BINS)),
    "mean_confidence",
    "fail_idi",
    "fail_tdi",
    "fail_adi",
)
#: Window features of the *inputs* model (also needs probabilities, inputs and TDI leaves).
INPUTS_FEATURES: tuple[str, ...] = (
    *REDUCED_FEATURES,
    "tdi_agreement",
    "tdi_coverage",
    "tdi_leaf_distance",
    *(f"pca_bin_{i}" for i in range(N_PCA_BINS)),
    "mean_pca_error",
    "mean_margin",
)
#: Features of the mix of predicted classes: normalised entropy and largest share of the predicted
#: labels (a model collapsing onto few classes), and the largest share-weighted drop of a class's mean
#: confidence below its clean calibration value.
CLASS_FEATURES: tuple[str, ...] = ("label_entropy", "label_max_share", "class_conf_drop")
#: Window features of the full model (every sample also carries its predicted label).
FULL_FEATURES: tuple[str, ...] = (*INPUTS_FEATURES, *CLASS_FEATURES)
#: Position of the window's mean confidence in every feature vector (the residual target's base).
MEAN_CONFIDENCE = REDUCED_FEATURES.index("mean_confidence")
#: What the ``shift_aware`` regressions may predict (see :class:`ShiftCalibration`).
SHIFT_TARGETS = ("residual", "accuracy")
#: Pseudo-count pulling a class's clean mean confidence toward the overall clean mean (rare classes).
CLASS_PRIOR_WEIGHT = 5.0


@dataclass(frozen=True)
class InputReference:
    """What live inputs are compared with (JSON-able): a PCA of the training inputs and the TDI leaves.

    ``center``/``scale``/``basis``: the PCA (``k`` components over standardised features; ``scale``
    has one entry for images, one per feature for tables); ``pca_edges``: bin edges of the
    reconstruction error; ``rule_label``/``rule_selected``: class and selection of every TDI leaf
    rule; ``leaf_ref``: the training data's share of every leaf; ``class_conf``: the mean top-class
    probability of the clean calibration split per predicted class (empty: no class features).
    """

    center: tuple[float, ...]
    scale: tuple[float, ...]
    basis: tuple[tuple[float, ...], ...]
    pca_edges: tuple[float, ...]
    rule_label: tuple[int, ...]
    rule_selected: tuple[bool, ...]
    leaf_ref: tuple[float, ...]
    class_conf: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_center", np.asarray(self.center, dtype=np.float64))
        object.__setattr__(self, "_scale", np.asarray(self.scale, dtype=np.float64))
        object.__setattr__(self, "_basis", np.asarray(self.basis, dtype=np.float64).reshape(-1, len(self.center)))
        object.__setattr__(self, "_label", np.asarray(self.rule_label, dtype=np.int64))
        object.__setattr__(self, "_selected", np.asarray(self.rule_selected, dtype=bool))
        object.__setattr__(self, "_fast_pca", self._fast_pca_terms())

    def _fast_pca_terms(self) -> tuple[np.ndarray, np.ndarray, float, float] | None:
        """For one global scale (images): ``(M, Bc, ‖c‖², s⁻²)`` with the float32 ``D×(k+1)`` matrix
        ``M = [Bᵀ/s | c/s²]``, so that one product ``f M`` gives both ``B z`` and ``f·c`` (see
        :meth:`pca_error`). None for per-feature scales (tables), where the direct form is kept:
        expanding ``‖(f − c)/s‖²`` would cancel badly for features far from zero with a small spread."""
        center, scale, basis = self._center, self._scale, self._basis  # type: ignore[attr-defined]
        if scale.size != 1 or not len(center):
            return None
        inv = 1.0 / float(scale[0])
        m = np.concatenate([basis.T * inv, (center * inv * inv)[:, None]], axis=1).astype(np.float32)
        bc = (center * inv) @ basis.T
        return np.ascontiguousarray(m), bc, float(((center * inv) ** 2).sum()), inv * inv

    @property
    def n_rules(self) -> int:
        return len(self.rule_label)

    @property
    def n_classes(self) -> int:
        return len(self.class_conf)

    def pca_error(self, features: np.ndarray) -> np.ndarray:
        """Root-mean-square PCA reconstruction error of every sample (standardised units), O(N·D·k).

        Computed in chunks of :data:`PCA_CHUNK` samples in one reused float64 buffer (the same
        operations in the same order as ``z = (f − center) / scale; r = z − (z Bᵀ) B``, without
        an N×D temporary per step)."""
        if len(features) == 0:
            return np.zeros(0)
        f = np.asarray(features).reshape(len(features), -1)
        n = len(f)
        fast = self._fast_pca  # type: ignore[attr-defined]
        if fast is not None and f.shape[1] == len(self.center):
            return self._pca_error_global_scale(f, *fast)
        center, scale = self._center, self._scale  # type: ignore[attr-defined]
        basis = self._basis  # type: ignore[attr-defined]
        out = np.empty(n, dtype=np.float64)
        buf = np.empty((min(PCA_CHUNK, n), f.shape[1]), dtype=np.float64)
        for a in range(0, n, PCA_CHUNK):
            z = buf[: min(PCA_CHUNK, n - a)]
            np.copyto(z, f[a : a + len(z)], casting="unsafe")
            np.subtract(z, center, out=z)
            np.divide(z, scale, out=z)
            z -= (z @ basis.T) @ basis
            np.multiply(z, z, out=z)
            out[a : a + len(z)] = z.mean(axis=1)
        return np.sqrt(out, out=out)

    @staticmethod
    def _pca_error_global_scale(f: np.ndarray, m: np.ndarray, bc: np.ndarray, cc: float, inv2: float) -> np.ndarray:
        """:meth:`pca_error` for one global scale ``s``, via ``‖z − Bᵀ B z‖² = ‖z‖² − ‖B z‖²`` (the rows
        of ``B`` are orthonormal) with ``z = (f − c)/s``: ``B z = f Bᵀ/s − B c/s`` and
        ``‖z‖² = ‖f‖²/s² − 2 f·c/s² + ‖c‖²/s²``. One float32 ``[N, D] × [D, k+1]`` product and one
        row norm, instead of the reconstruction ``[N, D]`` in float64 (3–5× less CPU on the request
        path; relative difference to the direct form about 1e-6)."""
        n, d = f.shape
        out = np.empty(n, dtype=np.float64)
        for a in range(0, n, 8 * PCA_CHUNK):
            g = np.asarray(f[a : a + 8 * PCA_CHUNK], dtype=np.float32)
            prod = (g @ m).astype(np.float64)
            proj = prod[:, :-1]
            proj -= bc
            zz = np.einsum("ij,ij->i", g, g).astype(np.float64) * inv2 - 2.0 * prod[:, -1] + cc
            zz -= np.einsum("ij,ij->i", proj, proj)
            out[a : a + len(g)] = np.maximum(zz, 0.0) / d
        return np.sqrt(out, out=out)

    def to_dict(self) -> dict[str, object]:
        return {
            "center": list(self.center),
            "scale": list(self.scale),
            "basis": [list(b) for b in self.basis],
            "pca_edges": list(self.pca_edges),
            "rule_label": list(self.rule_label),
            "rule_selected": list(self.rule_selected),
            "leaf_ref": list(self.leaf_ref),
            "class_conf": list(self.class_conf),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> InputReference:
        return cls(
            center=tuple(float(v) for v in d["center"]),
            scale=tuple(float(v) for v in d["scale"]),
            basis=tuple(tuple(float(v) for v in row) for row in d["basis"]),
            pca_edges=tuple(float(v) for v in d["pca_edges"]),
            rule_label=tuple(int(v) for v in d["rule_label"]),
            rule_selected=tuple(bool(v) for v in d["rule_selected"]),
            leaf_ref=tuple(float(v) for v in d["leaf_ref"]),
            class_conf=tuple(float(v) for v in d.get("class_conf", ())),
        )

    @classmethod
    def fit(
        cls,
        train_features: np.ndarray,
        clean_features: np.ndarray,
        *,
        per_feature_scale: bool,
        rule_label: Sequence[int] = (),
        rule_selected: Sequence[bool] = (),
        train_rules: np.ndarray | None = None,
        components: int = 10,
        clean_labels: np.ndarray | None = None,
        clean_confidences: np.ndarray | None = None,
        n_classes: int = 0,
    ) -> InputReference:
        """PCA of the training inputs (images: one global scale, tables: per-feature standard deviations);
        error bins from the clean calibration inputs; leaf shares from the training inputs' TDI rules;
        per predicted class, the clean calibration inputs' mean top-class probability (``clean_labels``,
        ``clean_confidences``, ``n_classes``; smoothed toward the overall mean with
        :data:`CLASS_PRIOR_WEIGHT` pseudo-samples)."""
        tr = np.asarray(train_features, dtype=np.float64).reshape(len(train_features), -1)
        center = tr.mean(axis=0)
        if per_feature_scale:
            scale = np.maximum(tr.std(axis=0), 1e-9)
        else:
            scale = np.array([max(float(np.abs(tr).max()), 1e-9)])
        z = (tr - center) / scale
        k = int(min(components, z.shape[0], z.shape[1]))
        # top-k eigenvectors of the D×D scatter matrix (cheaper than an SVD of the N×D data)
        _, vecs = np.linalg.eigh(z.T @ z)
        basis = vecs[:, ::-1][:, :k].T
        ref = cls(tuple(center), tuple(scale), tuple(tuple(r) for r in basis), (), (), (), ())
        errs = ref.pca_error(clean_features)
        edges = tuple(float(v) for v in np.quantile(errs, PCA_QUANTILES)) if len(errs) else (0.0,) * len(PCA_QUANTILES)
        n_rules = len(rule_label)
        if train_rules is not None and n_rules:
            counts = np.bincount(np.asarray(train_rules, dtype=np.int64), minlength=n_rules)[:n_rules]
            leaf_ref = counts / max(int(counts.sum()), 1)
        else:
            leaf_ref = np.zeros(n_rules)
        class_conf: tuple[float, ...] = ()
        if clean_labels is not None and clean_confidences is not None and n_classes > 0 and len(clean_labels):
            lab = np.clip(np.asarray(clean_labels, dtype=np.int64).reshape(-1), 0, n_classes - 1)
            conf = np.asarray(clean_confidences, dtype=np.float64).reshape(-1)
            counts = np.bincount(lab, minlength=n_classes)[:n_classes]
            sums = np.bincount(lab, weights=conf, minlength=n_classes)[:n_classes]
            w = CLASS_PRIOR_WEIGHT
            class_conf = tuple(float(v) for v in (sums + w * conf.mean()) / (counts + w))
        return replace(
            ref,
            pca_edges=edges,
            rule_label=tuple(int(v) for v in rule_label),
            rule_selected=tuple(bool(v) for v in rule_selected),
            leaf_ref=tuple(float(v) for v in leaf_ref),
            class_conf=class_conf,
        )


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
    residual target).
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
        )
        if out.target not in SHIFT_TARGETS:
            raise ValueError(f"unknown shift calibration target {out.target!r}; expected one of {SHIFT_TARGETS}")
        if any(len(q) != len(out.q_edges) + 1 for q in (out.q_full, out.q_inputs, out.q_reduced)):
            raise ValueError("shift calibration has the wrong number of interval bins")
        return out


@dataclass(frozen=True)
class Estimate:
    """A point estimate of accuracy with its 95% interval and the number of samples behind it."""

    value: float
    lower: float
    upper: float
    n: int

    def to_dict(self) -> dict[str, float | int]:
        return {"value": self.value, "lower": self.lower, "upper": self.upper, "n": self.n}


@dataclass(frozen=True)
class EstimatorCalibration:
    """What the estimators learn from the labeled calibration split (stored in the bundle)."""

    tpr: float
    fpr: float
    n_wrong: int
    n_right: int
    accuracy: float
    avg_conf: float
    atc_threshold: float
    shift: ShiftCalibration | None = None

    @property
    def n(self) -> int:
        return self.n_wrong + self.n_right

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {k: getattr(self, k) for k in _BASE_FIELDS}
        if self.shift is not None:
            d["shift"] = self.shift.to_dict()
        return d

    def with_shift(self, shift: ShiftCalibration | None) -> EstimatorCalibration:
        """A copy carrying ``shift`` (the ``shift_aware`` calibration)."""
        return replace(self, shift=shift)

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> EstimatorCalibration:
        return cls(
            tpr=float(d["tpr"]),  # type: ignore[arg-type]
            fpr=float(d["fpr"]),  # type: ignore[arg-type]
            n_wrong=int(d["n_wrong"]),  # type: ignore[call-overload]
            n_right=int(d["n_right"]),  # type: ignore[call-overload]
            accuracy=float(d["accuracy"]),  # type: ignore[arg-type]
            avg_conf=float(d["avg_conf"]),  # type: ignore[arg-type]
            atc_threshold=float(d["atc_threshold"]),  # type: ignore[arg-type]
            shift=_shift_or_none(d.get("shift")),
        )

    @classmethod
    def fit(cls, confidences: np.ndarray, correct: np.ndarray, failed: np.ndarray) -> EstimatorCalibration:
        """Fit from the calibration split: top-class probabilities, correctness, oracle fail flags."""
        conf = np.asarray(confidences, dtype=np.float64)
        ok = np.asarray(correct, dtype=bool)
        fail = np.asarray(failed, dtype=bool)
        if len(conf) == 0:
            raise ValueError("calibration split is empty")
        wrong = ~ok
        n_wrong, n_right = int(wrong.sum()), int(ok.sum())
        tpr = float((fail & wrong).sum() / n_wrong) if n_wrong else 0.0
        fpr = float((fail & ok).sum() / n_right) if n_right else 0.0
        return cls(
            tpr=tpr,
            fpr=fpr,
            n_wrong=n_wrong,
            n_right=n_right,
            accuracy=float(ok.mean()),
            avg_conf=float(conf.mean()),
            atc_threshold=atc_threshold(conf, float(ok.mean())),
        )


def _shift_or_none(d: object) -> ShiftCalibration | None:
    """The ``shift_aware`` calibration, or None when absent or of an older format (old bundles)."""
    if not isinstance(d, Mapping) or not d:
        return None
    try:
        return ShiftCalibration.from_dict(d)
    except (KeyError, ValueError, TypeError):
        return None


_BASE_FIELDS = ("tpr", "fpr", "n_wrong", "n_right", "accuracy", "avg_conf", "atc_threshold")


def atc_threshold(confidences: np.ndarray, accuracy: float) -> float:
    """Threshold ``t`` such that the share of ``confidences > t`` equals ``accuracy`` (Garg et al. 2022)."""
    c = np.sort(np.asarray(confidences, dtype=np.float64))
    n = len(c)
    k = int(round((1.0 - accuracy) * n))  # number of samples at or below t
    if k <= 0:
        return float(np.nextafter(c[0], -np.inf))
    if k >= n:
        return float(c[-1])
    return float(c[k - 1])


@dataclass(frozen=True)
class SampleExtras:
    """Per-sample inputs of the full ``shift_aware`` model, derived once per batch (O(N))."""

    margin: np.ndarray  # top-1 minus top-2 probability
    rules: np.ndarray  # TDI rule (leaf) index
    agree: np.ndarray  # predicted label equals the leaf's class
    covered: np.ndarray  # the leaf's rule is selected
    pca_error: np.ndarray  # PCA reconstruction error of the input
    #: predicted class index (None when not kept, e.g. by stores of an older layout: the full model
    #: then falls back to the inputs model)
    label: np.ndarray | None = None

    def take(self, idx: np.ndarray) -> SampleExtras:
        return SampleExtras(
            self.margin[idx],
            self.rules[idx],
            self.agree[idx],
            self.covered[idx],
            self.pca_error[idx],
            None if self.label is None else self.label[idx],
        )

    @classmethod
    def concatenate(cls, parts: Sequence[SampleExtras]) -> SampleExtras:
        """The extras of several batches one after the other (``label`` only when every part has it)."""
        arrays = [np.concatenate([getattr(p, f) for p in parts]) for f in _EXTRA_ARRAYS]
        labels = None if any(p.label is None for p in parts) else np.concatenate([p.label for p in parts])  # type: ignore[misc]
        margin, rules, agree, covered, pca_error = arrays
        return cls(margin, rules, agree, covered, pca_error, labels)

    @classmethod
    def compute(
        cls,
        probabilities: np.ndarray,
        labels: np.ndarray,
        features: np.ndarray,
        tdi_rules: np.ndarray,
        reference: InputReference,
    ) -> SampleExtras:
        p = np.asarray(probabilities, dtype=np.float64)
        p = p.reshape(len(p), -1)
        if p.shape[1] >= 2:
            top2 = np.partition(p, p.shape[1] - 2, axis=1)[:, -2:]
            margin = np.abs(top2[:, 1] - top2[:, 0])
        else:
            margin = np.abs(2 * p[:, 0] - 1)
        rules = np.asarray(tdi_rules, dtype=np.int64).reshape(-1)
        lab = np.asarray(labels, dtype=np.int64).reshape(-1)
        if reference.n_rules:
            r = _clip_index(rules, reference.n_rules)
            agree = reference._label[r] == lab  # type: ignore[attr-defined]
            covered = reference._selected[r]  # type: ignore[attr-defined]
        else:
            r = np.zeros(len(lab), dtype=np.int64)
            agree = covered = np.zeros(len(lab), dtype=bool)
        return cls(margin, r, agree, covered, reference.pca_error(features), lab)


_EXTRA_ARRAYS = ("margin", "rules", "agree", "covered", "pca_error")


def sample_extras(
    calibration: EstimatorCalibration,
    probabilities: np.ndarray | None,
    labels: np.ndarray | None,
    features: np.ndarray | None,
    tdi_rules: np.ndarray | None,
) -> SampleExtras | None:
    """Per-sample inputs of the full ``shift_aware`` model, or None when the calibration has no shift
    part or any input is missing (the estimator then uses its reduced model)."""
    shift = calibration.shift
    if shift is None or probabilities is None or labels is None or features is None or tdi_rules is None:
        return None
    return SampleExtras.compute(probabilities, labels, features, tdi_rules, shift.reference)


@dataclass
class WindowStats:
    """Additive sufficient statistics of a set of judged predictions.

    The ``*_ext`` group (``n_ext`` … ``leaves``) is only filled when the caller passes the optional
    per-sample inputs of :meth:`from_batch`; ``shift_aware`` then uses its full model.
    """

    n: int = 0
    fails: int = 0
    fails_by_family: dict[str, int] = field(default_factory=lambda: {"idi": 0, "tdi": 0, "adi": 0})
    conf_sum: float = 0.0
    conf_sq_sum: float = 0.0
    atc_above: int = 0
    #: samples per (verdict × confidence bin) cell, see :func:`cell_index` (``shift_aware``)
    cells: list[int] = field(default_factory=lambda: [0] * N_CELLS)
    #: samples with the optional per-sample inputs (probabilities, labels, inputs, TDI leaves)
    n_ext: int = 0
    margin_sum: float = 0.0
    #: predictions equal to the class of their TDI leaf / whose leaf holds a selected rule
    tdi_agree: int = 0
    tdi_covered: int = 0
    pca_sum: float = 0.0
    pca_bins: list[int] = field(default_factory=lambda: [0] * N_PCA_BINS)
    #: samples per TDI leaf rule (empty until a batch with leaves arrives)
    leaves: list[int] = field(default_factory=list)
    #: samples whose predicted label was passed; their count and top-class probability sum per class
    n_cls: int = 0
    class_counts: list[int] = field(default_factory=list)
    class_conf: list[float] = field(default_factory=list)

    @classmethod
    def from_batch(
        cls,
        verdicts: np.ndarray,
        confidences: np.ndarray,
        calibration: EstimatorCalibration,
        *,
        probabilities: np.ndarray | None = None,
        labels: np.ndarray | None = None,
        features: np.ndarray | None = None,
        tdi_rules: np.ndarray | None = None,
    ) -> WindowStats:
        """``verdicts`` are indices into ``invariants.oracle.VERDICTS`` (0 pass, 1 idi, 2 tdi, 3 adi).

        Optional, all four together (otherwise ``shift_aware`` falls back to its reduced model):
        ``probabilities`` [N, K] (the model's output), ``labels`` [N] (predicted class indices),
        ``features`` [N, D] (the flattened model inputs, as the oracle reads them) and ``tdi_rules``
        [N] (the TDI rule index of every sample's leaf, from
        :meth:`invariants.compiled.CompiledOracle.judge_with_rules`).
        """
        extras = sample_extras(calibration, probabilities, labels, features, tdi_rules)
        shift = calibration.shift
        return cls.of_samples(
            verdicts, confidences, calibration.atc_threshold, extras, shift.reference if shift is not None else None
        )

    @classmethod
    def of_samples(
        cls,
        verdicts: np.ndarray,
        confidences: np.ndarray,
        atc_threshold: float,
        extras: SampleExtras | None = None,
        reference: InputReference | None = None,
    ) -> WindowStats:
        """Statistics of samples whose :class:`SampleExtras` (if any) are already computed."""
        v = np.asarray(verdicts)
        c = np.asarray(confidences, dtype=np.float64)
        fam = np.bincount(v.astype(np.int64), minlength=4)
        out = cls(
            n=int(len(v)),
            fails=int((v != 0).sum()),
            fails_by_family={"idi": int(fam[1]), "tdi": int(fam[2]), "adi": int(fam[3])},
            conf_sum=float(c.sum()),
            conf_sq_sum=float((c * c).sum()),
            atc_above=int((c > atc_threshold).sum()),
            cells=cell_counts(v, c),
        )
        if extras is not None and reference is not None and len(extras.margin) == len(v):
            ref = reference
            out.n_ext = int(len(v))
            out.margin_sum = float(extras.margin.sum())
            out.tdi_agree = int(extras.agree.sum())
            out.tdi_covered = int(extras.covered.sum())
            out.pca_sum = float(extras.pca_error.sum())
            bins = np.searchsorted(np.asarray(ref.pca_edges), extras.pca_error, side="right")
            out.pca_bins = np.bincount(bins, minlength=N_PCA_BINS)[:N_PCA_BINS].tolist()
            out.leaves = np.bincount(extras.rules, minlength=ref.n_rules)[: ref.n_rules].tolist()
            k = ref.n_classes
            if extras.label is not None and k and len(extras.label) == len(v):
                lab = _clip_index(np.asarray(extras.label, dtype=np.int64), k)
                out.n_cls = int(len(v))
                out.class_counts = np.bincount(lab, minlength=k)[:k].tolist()
                out.class_conf = np.bincount(lab, weights=c, minlength=k)[:k].tolist()
        return out

    def _combine(self, other: WindowStats, sign: int) -> WindowStats:
        def vec(a: list[int], b: list[int]) -> list[int]:
            size = max(len(a), len(b))
            a2, b2 = a + [0] * (size - len(a)), b + [0] * (size - len(b))
            return [x + sign * y for x, y in zip(a2, b2, strict=True)]

        def fvec(a: list[float], b: list[float]) -> list[float]:
            size = max(len(a), len(b))
            a2, b2 = a + [0.0] * (size - len(a)), b + [0.0] * (size - len(b))
            return [x + sign * y for x, y in zip(a2, b2, strict=True)]

        return WindowStats(
            n=self.n + sign * other.n,
            fails=self.fails + sign * other.fails,
            fails_by_family={
                k: self.fails_by_family.get(k, 0) + sign * other.fails_by_family.get(k, 0)
                for k in ("idi", "tdi", "adi")
            },
            conf_sum=self.conf_sum + sign * other.conf_sum,
            conf_sq_sum=self.conf_sq_sum + sign * other.conf_sq_sum,
            atc_above=self.atc_above + sign * other.atc_above,
            cells=vec(self.cells, other.cells),
            n_ext=self.n_ext + sign * other.n_ext,
            margin_sum=self.margin_sum + sign * other.margin_sum,
            tdi_agree=self.tdi_agree + sign * other.tdi_agree,
            tdi_covered=self.tdi_covered + sign * other.tdi_covered,
            pca_sum=self.pca_sum + sign * other.pca_sum,
            pca_bins=vec(self.pca_bins, other.pca_bins),
            leaves=vec(self.leaves, other.leaves),
            n_cls=self.n_cls + sign * other.n_cls,
            class_counts=vec(self.class_counts, other.class_counts),
            class_conf=fvec(self.class_conf, other.class_conf),
        )

    def __add__(self, other: WindowStats) -> WindowStats:
        return self._combine(other, 1)

    def add_in_place(self, other: WindowStats) -> None:
        """``self = self + other`` without building a new object (same sums; the window buckets'
        hot path)."""
        self.n += other.n
        self.fails += other.fails
        mine, theirs = self.fails_by_family, other.fails_by_family
        self.fails_by_family = {k: mine.get(k, 0) + theirs.get(k, 0) for k in ("idi", "tdi", "adi")}
        self.conf_sum += other.conf_sum
        self.conf_sq_sum += other.conf_sq_sum
        self.atc_above += other.atc_above
        self.n_ext += other.n_ext
        self.margin_sum += other.margin_sum
        self.tdi_agree += other.tdi_agree
        self.tdi_covered += other.tdi_covered
        self.pca_sum += other.pca_sum
        self.n_cls += other.n_cls
        for vec, add in (
            (self.cells, other.cells),
            (self.pca_bins, other.pca_bins),
            (self.leaves, other.leaves),
            (self.class_counts, other.class_counts),
        ):
            if len(vec) < len(add):
                vec.extend([0] * (len(add) - len(vec)))
            for i in itertools.compress(range(len(add)), add):  # the non-zero entries (C-speed scan)
                vec[i] += add[i]
        fsum, fadd = self.class_conf, other.class_conf
        if len(fsum) < len(fadd):
            fsum.extend([0.0] * (len(fadd) - len(fsum)))
        for i, x in enumerate(fadd):
            fsum[i] += x

    def copy(self) -> WindowStats:
        return replace(
            self,
            fails_by_family=dict(self.fails_by_family),
            cells=list(self.cells),
            pca_bins=list(self.pca_bins),
            leaves=list(self.leaves),
            class_counts=list(self.class_counts),
            class_conf=list(self.class_conf),
        )

    def __sub__(self, other: WindowStats) -> WindowStats:
        return self._combine(other, -1)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WindowStats:
        fam = d.get("fails_by_family") or {}
        return cls(
            n=int(d["n"]),
            fails=int(d["fails"]),
            fails_by_family={k: int(v) for k, v in dict(fam).items()},
            conf_sum=float(d["conf_sum"]),
            conf_sq_sum=float(d["conf_sq_sum"]),
            atc_above=int(d["atc_above"]),
            cells=[int(v) for v in d.get("cells") or [0] * N_CELLS],
            n_ext=int(d.get("n_ext", 0)),
            margin_sum=float(d.get("margin_sum", 0.0)),
            tdi_agree=int(d.get("tdi_agree", 0)),
            tdi_covered=int(d.get("tdi_covered", 0)),
            pca_sum=float(d.get("pca_sum", 0.0)),
            pca_bins=[int(v) for v in d.get("pca_bins") or [0] * N_PCA_BINS],
            leaves=[int(v) for v in d.get("leaves") or []],
            n_cls=int(d.get("n_cls", 0)),
            class_counts=[int(v) for v in d.get("class_counts") or []],
            class_conf=[float(v) for v in d.get("class_conf") or []],
        )


def _clip01(v: float) -> float:
    return float(min(1.0, max(0.0, v)))


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(p * (1 - p) / n + z * z / (4 * n * n), 0.0)) / denom
    return _clip01(centre - half), _clip01(centre + half)


def _mean_interval(stats: WindowStats) -> tuple[float, float, float]:
    n = stats.n
    mean = stats.conf_sum / n
    var = max(stats.conf_sq_sum / n - mean * mean, 0.0) * n / max(n - 1, 1)
    half = Z95 * math.sqrt(var / n)
    return mean, mean - half, mean + half


def rogan_gladen(fail_share: float, n: int, cal: EstimatorCalibration) -> Estimate:
    """Accuracy = (TPR − r) / (TPR − FPR) with a delta-method interval (clipped to [0, 1]).

    When TPR ≤ FPR the oracle carries no information and the interval is [0, 1].
    """
    denom = cal.tpr - cal.fpr
    if denom <= 1e-9 or n == 0:
        return Estimate(_clip01(1.0 - fail_share), 0.0, 1.0, n)
    acc = (cal.tpr - fail_share) / denom
    err = 1.0 - acc
    var_r = fail_share * (1 - fail_share) / n
    var_tpr = cal.tpr * (1 - cal.tpr) / cal.n_wrong if cal.n_wrong else 0.25
    var_fpr = cal.fpr * (1 - cal.fpr) / cal.n_right if cal.n_right else 0.25
    e = min(max(err, 0.0), 1.0)
    var = (var_r + e * e * var_tpr + (1 - e) ** 2 * var_fpr) / (denom * denom)
    half = Z95 * math.sqrt(var)
    return Estimate(_clip01(acc), _clip01(acc - half), _clip01(acc + half), n)


def estimate_all(stats: WindowStats, calibration: EstimatorCalibration) -> dict[str, Estimate]:
    """All estimators on one set of statistics. An empty window gives no estimates."""
    n = stats.n
    if n <= 0:
        return {}
    out: dict[str, Estimate] = {}
    passes = n - stats.fails
    lo, hi = wilson(passes, n)
    out["icos"] = Estimate(passes / n, lo, hi, n)
    out["icos_corrected"] = rogan_gladen(stats.fails / n, n, calibration)
    mean, mlo, mhi = _mean_interval(stats)
    out["avg_conf"] = Estimate(_clip01(mean), _clip01(mlo), _clip01(mhi), n)
    lo, hi = wilson(stats.atc_above, n)
    out["atc"] = Estimate(stats.atc_above / n, lo, hi, n)
    shift = calibration.accuracy - calibration.avg_conf
    out["doc"] = Estimate(_clip01(mean + shift), _clip01(mlo + shift), _clip01(mhi + shift), n)
    if calibration.shift is not None and sum(stats.cells) == n:
        out["shift_aware"] = shift_aware(stats, calibration.shift).estimate
    return out


# -- shift_aware -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShiftAwareParts:
    """The pieces of a ``shift_aware`` estimate (for reports and the benchmark)."""

    estimate: Estimate
    model: str  # "full", "inputs" or "reduced"
    features: dict[str, float]


def class_features(stats: WindowStats, reference: InputReference) -> np.ndarray:
    """:data:`CLASS_FEATURES` of a window whose samples all carry their predicted label."""
    k = reference.n_classes
    counts = np.asarray(stats.class_counts, dtype=np.float64)
    n = float(counts.sum())
    share = counts / max(n, 1.0)
    nz = share[share > 0]
    entropy = float(-(nz * np.log(nz)).sum() / math.log(k)) if k > 1 else 0.0
    ref = np.asarray(reference.class_conf, dtype=np.float64)
    mean_conf = np.divide(np.asarray(stats.class_conf, dtype=np.float64), counts, out=ref.copy(), where=counts > 0)
    drop = float(np.max(share * (ref - mean_conf))) if k else 0.0
    return np.array([entropy, float(share.max()) if k else 0.0, drop])


def window_features(stats: WindowStats, reference: InputReference) -> tuple[np.ndarray, str]:
    """The feature vector of a window and the model it is for: ``full`` (:data:`FULL_FEATURES`) when
    every sample carries the optional per-sample inputs and its predicted label, ``inputs``
    (:data:`INPUTS_FEATURES`) when the labels are missing, else ``reduced`` (:data:`REDUCED_FEATURES`)."""
    n = stats.n
    if n <= 0:
        return np.zeros(len(REDUCED_FEATURES)), "reduced"
    cells = np.asarray(stats.cells, dtype=np.float64).reshape(N_VERDICTS, N_CONF_BINS)
    fam = stats.fails_by_family
    reduced = np.r_[
        cells.sum(axis=0) / n,
        stats.conf_sum / n,
        fam.get("idi", 0) / n,
        fam.get("tdi", 0) / n,
        fam.get("adi", 0) / n,
    ]
    if stats.n_ext != n:
        return reduced, "reduced"
    if reference.n_rules and len(stats.leaves) == reference.n_rules:
        leaf_tv = 0.5 * float(np.abs(np.asarray(stats.leaves) / n - np.asarray(reference.leaf_ref)).sum())
    else:
        leaf_tv = 0.0
    full = np.r_[
        reduced,
        stats.tdi_agree / n,
        stats.tdi_covered / n,
        leaf_tv,
        np.asarray(stats.pca_bins, dtype=np.float64) / n,
        stats.pca_sum / n,
        stats.margin_sum / n,
    ]
    k = reference.n_classes
    if k and stats.n_cls == n and len(stats.class_counts) == k and len(stats.class_conf) == k:
        return np.r_[full, class_features(stats, reference)], "full"
    return full, "inputs"


def _half_width(q_edges: Sequence[float], q: Sequence[float], value: float) -> float:
    return float(q[int(np.searchsorted(np.asarray(q_edges), value, side="right"))])


def shift_aware(stats: WindowStats, cal: ShiftCalibration) -> ShiftAwareParts:
    """The ``shift_aware`` estimate of a window (see the module docstring)."""
    n = stats.n
    if n <= 0:
        return ShiftAwareParts(Estimate(0.0, 0.0, 1.0, 0), "reduced", {})
    x, kind = window_features(stats, cal.reference)
    q, names = {
        "full": (cal.q_full, FULL_FEATURES),
        "inputs": (cal.q_inputs, INPUTS_FEATURES),
        "reduced": (cal.q_reduced, REDUCED_FEATURES),
    }[kind]
    value = _clip01(float(cal.predict(kind, x)[0]))
    model_err = _half_width(cal.q_edges, q, value)
    sampling = Z95 * math.sqrt(value * (1 - value) / n)
    half = math.hypot(model_err, sampling)
    est = Estimate(value, _clip01(value - half), _clip01(value + half), n)
    return ShiftAwareParts(est, kind, dict(zip(names, (float(v) for v in x), strict=True)))


@dataclass(frozen=True)
class JudgedSet:
    """One labeled calibration set: oracle verdicts, top-class probabilities, correctness, true
    classes (for label-shift resampling) and the optional per-sample inputs of the full model."""

    name: str
    verdicts: np.ndarray
    confidences: np.ndarray
    correct: np.ndarray
    y: np.ndarray | None = None
    extras: SampleExtras | None = None


#: Edges of the predicted-accuracy bins of the interval's model-error term.
Q_EDGES: tuple[float, ...] = (0.5, 0.75, 0.9)


def _window_plan(
    sets: list[JudgedSet], n_windows: int, rng: np.random.Generator, size: tuple[int, int]
) -> list[list[tuple[int, np.ndarray]]]:
    """Windows drawn from the sets (index 0 = clean): one set, or a mixture of 2–3 (sometimes with
    clean data), each sometimes resampled to a Dirichlet class prior (label shift)."""
    plans: list[list[tuple[int, np.ndarray]]] = []
    shifted = np.arange(1, len(sets))
    for _ in range(n_windows):
        u = rng.uniform()
        if u < 0.1 or not len(shifted):
            chosen = [0]
        elif u < 0.6:
            chosen = [int(rng.choice(shifted))]
        else:
            chosen = [int(v) for v in rng.choice(shifted, min(len(shifted), int(rng.integers(2, 4))), replace=False)]
            if rng.uniform() < 0.3:
                chosen.append(0)
        m = int(rng.integers(size[0], size[1] + 1))
        counts = rng.multinomial(m, rng.dirichlet(np.ones(len(chosen))))
        alpha = float(rng.choice([0.5, 2.0, 5.0])) if rng.uniform() < 0.3 else None
        plan = []
        prior = None
        for k, c in zip(chosen, counts, strict=True):
            if c == 0:
                continue
            s = sets[k]
            if alpha is not None and s.y is not None:
                if prior is None:
                    prior = rng.dirichlet(np.full(int(s.y.max()) + 1, alpha))
                p = prior[np.asarray(s.y, dtype=np.int64)]
                plan.append((k, rng.choice(len(s.correct), int(c), p=p / p.sum())))
            else:
                plan.append((k, rng.integers(0, len(s.correct), int(c))))
        plans.append(plan)
    return plans


def _interval_table(pred: np.ndarray, resid: np.ndarray) -> tuple[float, ...]:
    """95% quantile of |residual| per predicted-accuracy bin, never narrower for lower accuracy."""
    if len(resid) == 0:
        return (0.5,) * (len(Q_EDGES) + 1)
    bins = np.searchsorted(np.asarray(Q_EDGES), pred, side="right")
    overall = float(np.quantile(np.abs(resid), 0.95))
    q = []
    for b in range(len(Q_EDGES) + 1):
        r = np.abs(resid[bins == b])
        q.append(float(np.quantile(r, 0.95)) if len(r) >= 20 else overall)
    for b in range(len(q) - 2, -1, -1):  # lower predicted accuracy: at least as wide
        q[b] = max(q[b], q[b + 1])
    return tuple(q)


def fit_shift_calibration(
    clean: JudgedSet,
    shifted: list[JudgedSet],
    reference: InputReference,
    *,
    n_windows: int = 2000,
    window_size: tuple[int, int] = (400, 1600),
    folds: int = 3,
    seed: int = 0,
) -> ShiftCalibration:
    """Fit ``shift_aware`` on windows drawn from the clean calibration split and its corrupted copies.

    * ``n_windows`` windows (sizes in ``window_size``) are drawn: one corrupted set, or a mixture of
      2–3 (sometimes with clean data), a third of them resampled to a random class prior (label
      shift), a tenth clean; each gives the additive statistics a live window would hold and its
      true accuracy;
    * three gradient-boosted regressions from window features to accuracy minus the window's mean
      confidence (the *residual* target): ``full`` (:data:`FULL_FEATURES`, needs the per-sample
      inputs with the predicted labels), ``inputs`` (:data:`INPUTS_FEATURES`, the same without the
      labels) and ``reduced`` (:data:`REDUCED_FEATURES`);
    * interval: the corruption families are split into ``folds`` groups; each group is held out,
      the models are refitted (100 trees at a higher rate, to save time) on the windows without
      it and evaluated on the windows made only of it (and clean data). The 95% quantiles of those
      out-of-family errors per predicted-accuracy bin are the interval's model-error term.
    """
    sets = [clean, *shifted]
    rng = np.random.default_rng(seed)
    plans = _window_plan(sets, n_windows, rng, window_size)
    xf, xi, xr, truth, fams = [], [], [], [], []
    for plan in plans:
        v = np.concatenate([sets[k].verdicts[i] for k, i in plan])
        c = np.concatenate([sets[k].confidences[i] for k, i in plan])
        ok = np.concatenate([np.asarray(sets[k].correct, bool)[i] for k, i in plan])
        ex = None
        if all(sets[k].extras is not None for k, _ in plan):
            ex = SampleExtras.concatenate([sets[k].extras.take(i) for k, i in plan])  # type: ignore[union-attr]
        stats = WindowStats.of_samples(v, c, 0.5, ex, reference)
        full_x, _ = window_features(stats, reference)
        in_x, _ = window_features(replace(stats, n_cls=0), reference)
        red_x, _ = window_features(replace(stats, n_ext=0), reference)
        xf.append(np.r_[full_x, np.zeros(len(FULL_FEATURES) - len(full_x))])
        xi.append(np.r_[in_x, np.zeros(len(INPUTS_FEATURES) - len(in_x))])
        xr.append(red_x)
        truth.append(float(ok.mean()))
        fams.append({sets[k].name for k, _ in plan})
    y = np.asarray(truth)
    designs = {"full": np.asarray(xf), "inputs": np.asarray(xi), "reduced": np.asarray(xr)}
    # residual target: what the trees learn is how far accuracy falls below (or rises above) the
    # mean confidence, so a window unlike any calibration window keeps the confidence's estimate
    # plus the correction of its nearest calibration windows instead of their absolute accuracy
    base = designs["full"][:, MEAN_CONFIDENCE]
    models = {k: TreeEnsemble.fit(X, y - base, seed=seed) for k, X in designs.items()}
    families = sorted({s.name for s in shifted} - {clean.name})
    groups = [set(families[i::folds]) for i in range(min(folds, len(families)))]
    preds: dict[str, list[np.ndarray]] = {k: [] for k in designs}
    resid: dict[str, list[np.ndarray]] = {k: [] for k in designs}
    for g in groups:
        train = np.array([not (f & g) for f in fams])
        test = np.array([bool(f & g) and f <= g | {clean.name} for f in fams])
        if train.sum() < 50 or not test.any():
            continue
        for k, X in designs.items():
            tree = TreeEnsemble.fit(X[train], y[train] - base[train], n_trees=100, rate=0.075, seed=seed)
            m = tree.predict(X[test]) + base[test]
            preds[k].append(np.clip(m, 0, 1))
            resid[k].append(np.clip(m, 0, 1) - y[test])
    cat = lambda a: np.concatenate(a) if a else np.zeros(0)  # noqa: E731
    q = {k: _interval_table(cat(preds[k]), cat(resid[k])) for k in designs}
    return ShiftCalibration(
        full=models["full"],
        inputs=models["inputs"],
        reduced=models["reduced"],
        q_edges=Q_EDGES,
        q_full=q["full"],
        q_inputs=q["inputs"],
        q_reduced=q["reduced"],
        reference=reference,
        families=tuple(families),
        lofo_mae=float(np.mean(np.abs(cat(resid["full"])))) if resid["full"] else 0.0,
        target="residual",
    )
