"""Fitting a whole ICOS oracle from training and validation data (paper §5.4).

1. TDIs: the decision tree of Table 4 on the training set (inputs vs true labels).
2. The validation set is split, stratified by "model wrong / right", into an ADI-training part
   and a calibration part (``calibration_fraction`` held out, seeded).
3. ADIs: the random forest of Table 5 on the ADI-training part's probability vectors against
   ``wrong = argmax(probabilities) != y`` (the paper trains it on the validation set).
4. The whole ordered oracle (IDI → TDI → ADI) is judged on the held-out calibration part to
   measure its TPR/FPR (§5.3); the corrected accuracy estimator needs rates measured on data
   the forest has not seen.

Every knob of the fit is a field of :class:`~invariants.fit_params.FitParams`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from invariants.adi import CRITERION as ADI_CRITERION
from invariants.adi import AlgorithmInvariants
from invariants.fit_params import FitParams
from invariants.idi import IdiRuleSet
from invariants.oracle import Oracle, OracleCalibration, OracleResult, calibrate
from invariants.tdi import CRITERION as TDI_CRITERION
from invariants.tdi import TrainingInvariants

__all__ = ["FittedOracle", "fit_oracle", "stratified_split"]


@dataclass
class FittedOracle:
    """The oracle, its calibration on the held-out part of val, and how it was fitted: ``params``,
    and ``fit_params``, what a bundle records (the parameters that apply to every fit and counts);
    ``calibration_result``: the oracle's verdicts on the held-out part (what the calibration counted)."""

    oracle: Oracle
    calibration: OracleCalibration
    calibration_index: np.ndarray
    calibration_result: OracleResult
    params: FitParams
    fit_params: dict[str, Any] = field(default_factory=dict)


def stratified_split(strata: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(len(strata))`` into (kept, held_out) with ``round(fraction * n_s)`` of every
    stratum held out; both index arrays are sorted. Seeded with ``numpy.random.default_rng``."""
    strata = np.asarray(strata).reshape(-1)
    rng = np.random.default_rng(seed)
    held: list[np.ndarray] = []
    for value in np.unique(strata):
        members = np.flatnonzero(strata == value)
        count = int(round(fraction * members.shape[0]))
        held.append(rng.permutation(members)[:count])
    held_out = np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
    mask = np.zeros(strata.shape[0], dtype=bool)
    mask[held_out] = True
    return np.flatnonzero(~mask), held_out


def _subset_metadata(metadata: Mapping[str, Any] | None, index: np.ndarray, n: int) -> dict[str, Any] | None:
    if metadata is None:
        return None
    out: dict[str, Any] = {}
    for key, value in metadata.items():
        arr = np.asarray(value) if value is not None and not isinstance(value, (str, bytes)) else None
        out[key] = arr[index] if arr is not None and arr.ndim == 1 and arr.shape[0] == n else value
    return out


def fit_oracle(
    train_x: np.ndarray,
    train_y: np.ndarray,
    val_x: np.ndarray,
    val_y: np.ndarray,
    val_probabilities: np.ndarray,
    *,
    idi: IdiRuleSet | None,
    params: FitParams = FitParams(),
    feature_names: Sequence[str] | None = None,
    class_names: Sequence[str] | None = None,
    val_metadata: Mapping[str, Sequence[Any] | np.ndarray | Any] | None = None,
    progress: Callable[[str], None] | None = None,
    val_predicted: np.ndarray | None = None,
) -> FittedOracle:
    """Fit TDIs on train, ADIs on part of val, and calibrate the oracle on the rest of val.

    ``params`` gives C, S, the tree's leaf size, the forest's size, the calibration share and the seed
    (a :class:`~invariants.fit_params.FitParams` validates them when it is built).
    ``class_names`` only makes the TDI rule texts readable (defaults to the IDI classes).
    ``val_predicted``: the model's predicted labels on val when they are not the argmax of
    ``val_probabilities`` (a binary model with a decision threshold).
    """

    say = progress or (lambda _m: None)
    val_y, probs, val_flat = _checked_validation(val_x, val_y, val_probabilities)
    if class_names is None and idi is not None:
        class_names = idi.classes

    train_n = int(np.asarray(train_x).shape[0])
    tdi_x, tdi_y = _tdi_records(train_x, train_y, params)
    say(f"fitting training-data-dependent invariants (decision tree on {len(tdi_y)} of {train_n} training records)")
    tdi = TrainingInvariants.fit(
        tdi_x,
        tdi_y,
        confidence=params.confidence,
        support=params.support,
        min_samples_leaf=params.min_samples_leaf,
        feature_names=feature_names,
        class_names=class_names,
        seed=params.seed,
    )
    say(
        f"{len(tdi.rules)} leaves, {len(tdi.selected_rules)} selected "
        f"(confidence >= {params.confidence}, support > {params.support})"
    )

    predicted = np.argmax(probs, axis=1) if val_predicted is None else np.asarray(val_predicted, dtype=np.int64)
    if predicted.shape != val_y.shape:
        raise ValueError(f"{predicted.shape[0]} val predicted labels but {val_y.shape[0]} val labels")
    wrong = predicted != val_y
    adi_index, calibration_index = stratified_split(wrong, params.calibration_fraction, params.seed)
    if adi_index.size == 0 or calibration_index.size == 0:
        raise ValueError(f"{val_y.shape[0]} validation records are too few to split for calibration")
    say(
        f"fitting algorithm-dependent invariants (random forest, {params.n_estimators} trees, "
        f"{adi_index.size} validation records, {int(wrong[adi_index].sum())} wrong)"
    )
    adi = AlgorithmInvariants.fit(
        probs[adi_index], wrong[adi_index], n_estimators=params.n_estimators, seed=params.seed
    )

    oracle = Oracle(idi, tdi, adi)
    say(f"calibrating the oracle on {calibration_index.size} held-out validation records")
    result = oracle.judge(
        val_flat[calibration_index],
        probs[calibration_index],
        predicted[calibration_index],
        metadata=_subset_metadata(val_metadata, calibration_index, val_y.shape[0]),
        feature_names=feature_names,
    )
    calibration = calibrate(result, wrong[calibration_index])
    say(f"oracle on calibration: TPR {calibration.tpr:.3f}, FPR {calibration.fpr:.3f}, F1 {calibration.f1:.3f}")
    counts = {"n_train": train_n, "n_val": int(val_y.shape[0]), "n_adi_train": int(adi_index.size)}
    recorded = _recorded(params, oracle, counts, calibration_index, wrong)
    return FittedOracle(oracle, calibration, calibration_index, result, params, recorded)


def _tdi_records(train_x: np.ndarray, train_y: np.ndarray, params: FitParams) -> tuple[np.ndarray, np.ndarray]:
    """The training records the TDI tree grows on: all, or a stratified sample of
    :attr:`~invariants.fit_params.FitParams.tdi_max_records` (seeded)."""
    y = np.asarray(train_y).reshape(-1)
    if len(y) <= params.tdi_max_records:
        return train_x, train_y
    _, keep = stratified_split(y, params.tdi_max_records / len(y), params.seed)
    return np.asarray(train_x)[keep], y[keep]


def _checked_validation(
    val_x: np.ndarray, val_y: np.ndarray, val_probabilities: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The validation labels (int64 ``[N]``), probabilities (float32 ``[N, K]``) and inputs (one row per
    record), checked to hold as many records each."""
    val_y = np.asarray(val_y).reshape(-1).astype(np.int64)
    probs = np.asarray(val_probabilities, dtype=np.float32)
    if probs.ndim != 2 or probs.shape[0] != val_y.shape[0]:
        raise ValueError(f"val probabilities of shape {probs.shape} do not match {val_y.shape[0]} val labels")
    val_flat = np.asarray(val_x)
    val_flat = val_flat.reshape(val_flat.shape[0], -1) if val_flat.ndim else val_flat
    if val_flat.shape[0] != val_y.shape[0]:
        raise ValueError(f"{val_flat.shape[0]} val inputs but {val_y.shape[0]} val labels")
    return val_y, probs, val_flat


def _recorded(
    params: FitParams, oracle: Oracle, counts: dict[str, int], calibration_index: np.ndarray, wrong: np.ndarray
) -> dict[str, Any]:
    """What a bundle records of the fit: the parameters that apply to every fit, the criteria and counts."""
    tdi = oracle.tdi
    assert tdi is not None  # fit_oracle always builds it
    return {
        **params.recorded(),
        "tdi_criterion": TDI_CRITERION,
        "adi_criterion": ADI_CRITERION,
        **counts,
        "n_calibration": int(calibration_index.size),
        "n_idi_rules": len(oracle.idi.rules) if oracle.idi is not None else 0,
        "n_tdi_leaves": len(tdi.rules),
        "n_tdi_selected": len(tdi.selected_rules),
        "val_accuracy": float(1.0 - wrong.mean()) if wrong.size else 0.0,
    }
