"""Running a model over a data set offline: its predictions and the feature view the invariants read.

Every offline pass of a model over many inputs (``fit``'s training and validation sets, the corrupted
copies of the calibration split, ``check``'s data) goes through :func:`predict_and_view`, batch by batch,
so that no pass holds more than one batch of the model's activations, and a corrupted copy of large inputs
never exists whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.model.classifier import OnnxClassifier, Prediction
from agent.model.inputs import Inputs, rule_values
from agent.offline import fit_progress


class LazySource:
    """Inputs read a batch at a time from files (an image folder), prepared for the model as they come."""

    def __init__(self, model: OnnxClassifier, raw: Any) -> None:
        self.model = model
        self.raw = raw

    @property
    def n(self) -> int:
        return int(self.raw.n)

    def __len__(self) -> int:
        return self.n

    def batches(self, size: int) -> Iterator[Inputs]:
        for b in self.raw.batches(size):
            yield self.model.prepare_file(b)

    def take(self, index: np.ndarray | slice) -> Inputs:
        return self.model.prepare_file(self.raw.take(index))


def source_of(model: OnnxClassifier, x: Any) -> Inputs | LazySource:
    """A data set's inputs, prepared for ``model``: in memory, or read from files a batch at a time."""
    if hasattr(x, "batches") and hasattr(x, "take") and not isinstance(x, Inputs | np.ndarray | dict):
        return LazySource(model, x)
    return model.prepare_file(x)


def subset(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """At most ``k`` of ``n`` indices, sorted (all of them when ``n ≤ k``)."""
    return np.arange(n) if n <= k else np.sort(rng.choice(n, size=k, replace=False))


#: A change applied to each batch before the model sees it (a corruption at a fixed strength).
Transform = Callable[[Inputs], Inputs]


@dataclass(frozen=True)
class Viewed:
    """The model's predictions on a data set (without its extra outputs), the feature view of every
    sample, and the values the IDI rules read of named inputs (``rule_values``; empty unless asked)."""

    prediction: Prediction
    features: np.ndarray
    rule_values: dict[str, np.ndarray] = field(default_factory=dict)

    def take(self, index: np.ndarray) -> Viewed:
        """The same pass restricted to the samples ``index``."""
        return Viewed(
            self.prediction.take(index), self.features[index], {k: v[index] for k, v in self.rule_values.items()}
        )


def predict_and_view(
    model: OnnxClassifier,
    x: Inputs | LazySource,
    desc: str | None = None,
    batch_size: int | None = None,
    *,
    transform: Transform | None = None,
    rule_inputs: frozenset[str] = frozenset(),
) -> Viewed:
    """Predictions and the feature view of ``x``, batch by batch (``batch_size``, by default the model's
    :meth:`~agent.model.inputs.Signature.batch_rows`), each batch first changed by ``transform`` when
    given; the model's extra outputs (an embedding) are read into the view and not kept. ``desc`` shows a
    progress bar on stderr (hidden for short runs, and inside a fit, whose own bar the rows move:
    :mod:`agent.offline.fit_progress`); ``rule_inputs``: named inputs whose values the IDI rules read,
    taken from each (transformed) batch."""
    from tqdm import tqdm

    probs: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    feats: list[np.ndarray] = []
    values: list[dict[str, np.ndarray]] = []
    quiet = desc is None or fit_progress.current() is not None
    bar = tqdm(total=len(x), desc=desc, unit="sample", leave=False, mininterval=0.5, delay=1.0, disable=quiet)
    with bar:
        for batch in x.batches(batch_size or model.signature.batch_rows()):
            if transform is not None:
                batch = transform(batch)
            p = model.predict_prepared(batch)
            probs.append(p.probabilities)
            labels.append(p.predicted)
            feats.append(model.features(batch, p))
            if rule_inputs:
                values.append(rule_values(batch, rule_inputs))
            bar.update(len(p.predicted))
            fit_progress.rows_done(len(p.predicted))
    named = {k: np.concatenate([v[k] for v in values]) for k in values[0]} if values else {}
    return Viewed(Prediction(np.concatenate(probs), np.concatenate(labels)), np.concatenate(feats), named)
