"""The model zoo: real classifiers of every kind the agent serves, with seeded data and shifts.

``build(name, workdir, seed)`` returns a :class:`ZooModel`: the ``.onnx`` file, its inputs as the graph
declares them, class names, train/validation/test splits (one array per input) and named shifts. Entries:

==========================  ===================================================================================
``text_tfidf``              scikit-learn TF-IDF + logistic regression; one string input ``text`` ``[None, 1]``
``tabular_categorical``     ColumnTransformer (scaler, one-hot) + logistic regression; one input per column:
                            FP64, FP32, INT64 numbers and three string columns, ``[None, 1]`` each
``lightgbm``                LightGBM via onnxmltools; ``input`` FP32 ``[None, 20]``
``token_classifier``        embedding, masked mean pooling, dense+tanh, logits; ``input_ids`` and
                            ``attention_mask`` INT64 ``[batch, sequence]``, the sequence length dynamic
``resnet224``               ResNet-style CNN (shipped, trained with torch); ``input`` FP32 NCHW 3×224×224
``resnet224_nhwc_uint8``    the same network behind ``input`` UINT8 NHWC 224×224×3
``mnist_cnn``               the agent's shipped MNIST CNN; ``input`` FP32 ``[N, 1, 28, 28]``
==========================  ===================================================================================

Builders import their heavy dependencies (lightgbm, onnxmltools, scipy) only when called. Builds are cached
in ``workdir`` (see :mod:`.core`). ``python -m bench.zoo`` prints each entry's accuracy in distribution and
under its shifts.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from bench.zoo.core import InputSpec, Shift, Split, ZooModel

__all__ = ["BUILDERS", "NAMES", "InputSpec", "Shift", "Split", "ZooModel", "build"]

#: Entry name → (module, function): the one registry of the zoo.
BUILDERS: dict[str, tuple[str, str]] = {
    "text_tfidf": ("bench.zoo.text_tfidf", "build"),
    "tabular_categorical": ("bench.zoo.tabular_categorical", "build"),
    "lightgbm": ("bench.zoo.gradient_boosting", "build"),
    "token_classifier": ("bench.zoo.token_classifier", "build"),
    "resnet224": ("bench.zoo.resnet224", "build_nchw"),
    "resnet224_nhwc_uint8": ("bench.zoo.resnet224", "build_nhwc_uint8"),
    "mnist_cnn": ("bench.zoo.mnist", "build"),
}
NAMES = tuple(BUILDERS)


def build(name: str, workdir: str | os.PathLike[str], seed: int = 0, **options: Any) -> ZooModel:
    """The entry ``name``, built (or read from the cache in ``workdir``) for ``seed``.

    ``options`` go to the entry's builder: ``sizes=(train, val, test)`` for the generated ones,
    ``locale=`` for ``text_tfidf``.
    """
    if name not in BUILDERS:
        raise KeyError(f"no zoo entry {name!r}; entries: {', '.join(NAMES)}")
    module, function = BUILDERS[name]
    builder = getattr(importlib.import_module(module), function)
    model = builder(workdir, seed, **options)
    assert isinstance(model, ZooModel)
    return model
