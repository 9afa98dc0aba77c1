"""The model flags ``fit`` and ``check`` share: which output holds the class scores, and what they are."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.model.classifier import OnnxClassifier


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="ONNX classifier")
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
