"""Oracle overhead and fit time on the shipped MNIST CNN.

* Overhead: time of judging a batch (IDI → TDI → ADI) ÷ time of the model's own inference on the same
  batch, at batch 1 and 64 (targets ≤ 0.30 and ≤ 0.10), for the compiled oracle on both engines
  (one onnxruntime graph, numpy tree arrays) and the reference numpy oracle.
* Fit time of TDI + ADI on 28,000 × 784 inputs (MNIST-5k training split plus shifted/noisy copies).
  Target ≤ 60 s on 2 cores. The baseline printed beside it is one epoch of model inference over the
  same inputs, measured in the same run.

Run: ``python -m bench oracle`` (or ``python -m bench.bench_oracle``), from the repository root.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np

from agent.data.datasets import mnist_splits
from agent.model.classifier import OnnxClassifier, Prediction, default_model_path
from invariants.compiled import CompiledOracle
from invariants.fitting import fit_oracle


def _best_of(fn: Callable[[], object], repeat: int, number: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def _augment(x: np.ndarray, y: np.ndarray, total: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    xs, ys = [x], [y]
    n = len(x)
    while sum(len(a) for a in xs) < total:
        dx, dy = rng.integers(-2, 3, size=2)
        shifted = np.roll(np.roll(x, int(dy), axis=-2), int(dx), axis=-1)
        noisy = np.clip(shifted + rng.normal(0, 12, x.shape), 0, 255).astype(np.float32)
        xs.append(noisy)
        ys.append(y)
    return np.concatenate(xs)[:total], np.concatenate(ys)[:total] if n else y


def main(argv: list[str]) -> int:
    model = OnnxClassifier.load(default_model_path())
    splits = mnist_splits()
    fitted = fit_oracle(
        model.features(model.prepare_array(splits.train.x)),
        splits.train.y,
        model.features(model.prepare_array(splits.val.x)),
        splits.val.y,
        model.predict_batched(splits.val.x).probabilities,
        idi=None,
    )
    reference = fitted.oracle
    compiled = CompiledOracle(reference, model.n_features, model.n_classes)
    arrays = CompiledOracle(reference, model.n_features, model.n_classes, engine="arrays")
    print("oracle overhead (judging ÷ model inference on the same batch; target <= 0.30 at batch 1, <= 0.10 at 64)")
    for batch in (1, 64):
        x = model.prepare_array(splits.test.x[:batch])
        pred = model.predict_prepared(x)
        number = 400 if batch == 1 else 60

        def infer(x: np.ndarray = x) -> object:
            return model.predict_prepared(x)

        def judge_compiled(x: np.ndarray = x, p: Prediction = pred) -> object:
            return compiled.judge(model.features(x), p.probabilities, p.predicted)

        def judge_arrays(x: np.ndarray = x, p: Prediction = pred) -> object:
            return arrays.judge(model.features(x), p.probabilities, p.predicted)

        def judge_reference(x: np.ndarray = x, p: Prediction = pred) -> object:
            return reference.judge(model.features(x), p.probabilities, p.predicted)

        t_model = _best_of(infer, repeat=5, number=number)
        t_comp = _best_of(judge_compiled, repeat=5, number=number)
        t_arr = _best_of(judge_arrays, repeat=5, number=number)
        t_ref = _best_of(judge_reference, repeat=5, number=number)
        ratio, target = t_comp / t_model, 0.30 if batch == 1 else 0.10
        print(
            f"  batch {batch:>3}: model {t_model * 1e3:7.3f} ms | onnxruntime graph {t_comp * 1e3:7.3f} ms, "
            f"ratio {ratio:5.2f} {'OK' if ratio <= target else 'ABOVE TARGET'} (<= {target:.2f}) | tree arrays "
            f"{t_arr * 1e3:7.3f} ms, ratio {t_arr / t_model:5.2f} | reference numpy oracle "
            f"{t_ref * 1e3:7.3f} ms, ratio {t_ref / t_model:5.2f}"
        )

    x_aug, y_aug = _augment(splits.train.x, splits.train.y, 28_000, seed=1)
    xv_aug, yv_aug = _augment(splits.val.x, splits.val.y, 6_000, seed=2)
    feats = model.features(x_aug)
    vfeats = model.features(xv_aug)
    t0 = time.perf_counter()
    vprob = model.predict_batched(xv_aug).probabilities  # predict_batched prepares each chunk
    model.predict_batched(x_aug)
    t_infer = time.perf_counter() - t0
    t0 = time.perf_counter()
    fitted = fit_oracle(feats, y_aug, vfeats, yv_aug, vprob, idi=None)
    t_fit = time.perf_counter() - t0
    tdi = fitted.oracle.tdi
    assert tdi is not None
    print(
        f"fit TDI + ADI on {feats.shape[0]:,} x {feats.shape[1]} (+ ADI on {len(vfeats):,} validation records): "
        f"{t_fit:.1f} s (target <= 60 s; {'OK' if t_fit <= 60 else 'ABOVE TARGET'}); "
        f"{len(tdi.rules)} leaves, {len(tdi.selected_rules)} selected"
    )
    print(
        f"  baseline: inference over the same {len(feats) + len(vfeats):,} inputs took {t_infer:.1f} s "
        f"(fit ÷ inference = {t_fit / t_infer:.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
