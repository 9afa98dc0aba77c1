"""The model flags ``fit`` and ``check`` share: which output holds the class scores, and what they are."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.model.classifier import OnnxClassifier


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", help="ONNX classifier (not with a table of predictions: see --reference / --proba-columns)"
    )
    p.add_argument(
        "--scores-output",
        metavar="NAME",
        help="output holding the class scores, when the model has several (default: 'probabilities', the one "
        "float output, or skl2onnx's ZipMap output)",
    )
    p.add_argument(
        "--scores-kind",
        choices=("auto", "logits", "probabilities"),
        default="auto",
        help="what --scores-output holds (default auto: probabilities after a Softmax or when named so, else logits)",
    )


def load_model(args: argparse.Namespace) -> OnnxClassifier:
    """The model the flags name (raises :class:`~agent.model.classifier.ModelLoadError`, a user error)."""
    from agent.model.classifier import OnnxClassifier  # lazy: keeps onnxruntime out of CLI start-up

    return OnnxClassifier.load(args.model, scores_output=args.scores_output, scores_kind=args.scores_kind)


def add_table_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that describe a table of predictions (a model that is not ONNX)."""
    p.add_argument(
        "--proba-columns",
        metavar="COLS",
        help="comma-separated predicted probability columns, one per class in class order, or the one "
        "column of a binary model's probability of class 1",
    )
    p.add_argument(
        "--feature-columns",
        metavar="COLS",
        help="comma-separated feature columns (default: every other numeric column)",
    )
    p.add_argument(
        "--batch-rows",
        type=int,
        default=16384,
        help="rows of a table read at once (bounds memory whatever the file's length; default 16384)",
    )


def split_columns(value: str | None) -> list[str] | None:
    """``"a, b,c"`` → ``["a", "b", "c"]``; None stays None."""
    if value is None:
        return None
    return [c.strip() for c in value.split(",") if c.strip()]
