"""Layout of the window statistic and of the ``shift_aware`` feature vectors.

The bins every window counts its samples in (oracle verdict × top-class probability, PCA error) and
the names of the window features the ``shift_aware`` regressions read. Statistics, calibration and
estimators share these constants, so they live below all of them.
"""

from __future__ import annotations

import numpy as np

from invariants.oracle import FAMILIES, Verdict

#: Inner edges of the top-class-probability bins used by ``shift_aware`` (6 bins).
CONF_EDGES: tuple[float, ...] = (0.6, 0.8, 0.9, 0.97, 0.995)
N_CONF_BINS = len(CONF_EDGES) + 1
#: Verdict groups (one per :class:`invariants.oracle.Verdict`: pass, fail:idi, fail:tdi, fail:adi).
N_VERDICTS = len(Verdict)
N_CELLS = N_VERDICTS * N_CONF_BINS


def conf_bins(confidences: np.ndarray) -> np.ndarray:
    """Bin index (0..5) of each top-class probability (bins split at :data:`CONF_EDGES`)."""
    return np.searchsorted(np.asarray(CONF_EDGES), np.asarray(confidences, dtype=np.float64), side="right")


def cell_index(verdicts: np.ndarray, confidences: np.ndarray) -> np.ndarray:
    """Cell of each sample: ``verdict * N_CONF_BINS + confidence bin``."""
    v = clip_index(np.asarray(verdicts, dtype=np.int64), N_VERDICTS)
    return v * N_CONF_BINS + conf_bins(confidences)


def cell_counts(verdicts: np.ndarray, confidences: np.ndarray) -> list[int]:
    """Number of samples per cell (length :data:`N_CELLS`)."""
    idx = cell_index(verdicts, confidences)
    return list(np.bincount(idx, minlength=N_CELLS)[:N_CELLS].tolist())


def clip_index(a: np.ndarray, size: int) -> np.ndarray:
    """``a`` clipped to ``0 .. size − 1`` (two ufunc calls; ``np.clip``'s wrapper costs more than the
    work on a request-sized batch)."""
    return np.minimum(np.maximum(a, 0), size - 1)


#: Bins of the window's mean PCA reconstruction error, as quantiles of the clean calibration split.
PCA_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)
N_PCA_BINS = len(PCA_QUANTILES) + 1
#: Bins the TDI leaves are grouped into for the ``tdi_leaf_distance`` feature: contiguous runs of
#: leaves (in tree order, so neighbouring regions of the input space) of about equal training mass.
#: A bounded number keeps the window statistic and its Prometheus export small whatever the tree's
#: size (an unpruned TDI tree has hundreds of leaves).
LEAF_BINS = 16
#: Window features of the reduced model (computable from verdicts and confidences alone).
REDUCED_FEATURES: tuple[str, ...] = (
    *(f"conf_bin_{i}" for i in range(N_CONF_BINS)),
    "mean_confidence",
    *(f"fail_{family}" for family in FAMILIES),
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


#: Floor of a feature's scale, as a share of the median scale of the features that vary: a feature
#: constant where the scales were measured (a pixel always 0 in training, a confidence bin an
#: underconfident model never reaches) must not turn the few live samples that move it into errors
#: and distances of millions.
MIN_SCALE_SHARE = 0.1


def floored_scales(std: np.ndarray, minimum: float) -> np.ndarray:
    """``std`` per feature, at least :data:`MIN_SCALE_SHARE` of the median of those above 1e-9 (1.0
    when none varies) and at least ``minimum``."""
    varying = std[std > 1e-9]
    floor = MIN_SCALE_SHARE * float(np.median(varying)) if len(varying) else 1.0
    return np.maximum(std, max(floor, minimum))
