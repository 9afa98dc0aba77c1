"""The challenger's work on a group of paired requests: its model and oracle on the requests' inputs
(:func:`predict`), then the statistics of both versions and the pair's sums (:func:`paired_stats`), each
version's built as the recorder builds the champion's windows (:func:`~agent.judging.recorder.judged_stats`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from agent.errors import UserError
from agent.estimation.pairs.calibration import Disagreements, PairCalibration
from agent.estimation.pairs.paired import PairSums
from agent.estimation.statistics.extras_columns import extras_from_columns
from agent.estimation.statistics.window import sample_extras
from agent.judging.paired_windows import PairedStats
from agent.judging.recorder import JudgedBatch, judged_stats
from agent.judging.runtime import Runtime
from agent.judging.verdicts import JudgeWork, judge
from agent.model.inputs import Inputs
from exporters.challenger_metrics import ChallengerMetrics


class BadOutput(UserError):
    """The challenger's model answered what no classifier of the pair can: scores that are not finite, or
    another number of classes than its bundle's (nothing of such an answer is recorded): a mistake in the model
    file the user gave as challenger, counted and set aside, never answered to a client."""


def checked(runtime: Runtime, probabilities: np.ndarray, n: int) -> np.ndarray:
    """``probabilities`` if they are ``n`` finite rows of the bundle's classes; else :class:`BadOutput`."""
    k = len(runtime.classes)
    if probabilities.ndim != 2 or probabilities.shape != (n, k):
        raise BadOutput(f"the challenger answered scores of shape {list(probabilities.shape)}, expected [{n}, {k}]")
    if not np.isfinite(probabilities).all():
        raise BadOutput("the challenger answered scores that are not finite (NaN or infinite)")
    return probabilities


def predict(runtime: Runtime, batches: Sequence[JudgedBatch], metrics: ChallengerMetrics) -> list[JudgeWork]:
    """The challenger's model (``runtime``) on every request's inputs (one call where their shapes allow), its
    oracle on the predictions (one call for the requests without metadata); one judged work per request.
    Raises :class:`BadOutput` for an answer no classifier of the pair can give, before anything is judged."""
    classifier = runtime.classifier
    assert classifier is not None
    x = Inputs.concatenate([b.inputs for b in batches if b.inputs is not None])
    t0 = time.perf_counter()
    pred = classifier.predict_prepared(x)
    metrics.inference.observe(time.perf_counter() - t0)
    checked(runtime, pred.probabilities, sum(len(b.predicted) for b in batches))
    features = classifier.features(x, pred)
    works, start = [], 0
    for b in batches:
        rows = slice(start, start + len(b.predicted))
        start += len(b.predicted)
        works.append(
            JudgeWork(runtime, features[rows], pred.probabilities[rows], pred.predicted[rows], b.metadata, None)
        )
    judge(works)
    return works


def paired_stats(
    runtime: Runtime, pair: PairCalibration, group: Sequence[tuple[JudgedBatch, JudgeWork]], per_class: bool
) -> tuple[PairedStats, Disagreements, np.ndarray]:
    """The paired statistics of requests of one champion runtime (each with the challenger's judged work):
    the champion's, the challenger's (``runtime``) and the pair's sums; their disagreements and where each
    request starts in them. ``per_class``: with the per-class sums (within the class cap)."""
    rt = group[0][0].rt
    bs, ws = [b for b, _ in group], [w for _, w in group]
    offsets = np.cumsum([0, *(len(b.predicted) for b in bs)])
    pa, la = np.concatenate([b.probabilities for b in bs]), np.concatenate([b.predicted for b in bs])
    pb, lb = np.concatenate([w.probabilities for w in ws]), np.concatenate([w.predicted for w in ws])
    dis = pair.disagreements(pa, pb, la, lb)
    extras_a = None
    if all(b.extras is not None for b in bs):
        cols = np.concatenate([b.extras for b in bs if b.extras is not None])
        extras_a = replace(extras_from_columns(cols), label=np.asarray(la, dtype=np.int64))
    verdicts_a = np.concatenate([np.asarray(b.verdicts, dtype=np.int8) for b in bs])
    champion, _, _ = judged_stats(rt, pa, la, verdicts_a, extras_a, per_class=per_class)
    rules = [w.tdi_rules for w in ws if w.tdi_rules is not None]
    tdi: np.ndarray | None = np.concatenate(rules) if len(rules) == len(ws) else None
    features = np.concatenate([w.features for w in ws])
    extras_b = sample_extras(runtime.calibration, pb, lb, features, tdi)
    verdicts_b = np.concatenate([np.asarray(w.verdicts_or_raise(), dtype=np.int8) for w in ws])
    challenger, _, _ = judged_stats(runtime, pb, lb, verdicts_b, extras_b, per_class=per_class)
    return PairedStats(champion, challenger, PairSums.of_disagreements(len(pa), dis)), dis, offsets
