"""The image preprocessing a bundle records: its JSON form and the round trip through it."""

from __future__ import annotations

import json

import numpy as np

from agent.data.images import Preprocess


def test_preprocess_records_every_field_with_lists_and_reads_back_the_same() -> None:
    pre = Preprocess.for_input("image", [3, 32, 24], np.dtype("float32")).with_options(
        "scale=1/255 mean=0.485,0.456,0.406 std=0.229,0.224,0.225"
    )
    recorded = pre.to_dict()
    assert recorded == {
        "height": 32,
        "width": 24,
        "layout": "nchw",
        "channels": 3,
        "dtype": "float32",
        "scale": 1.0 / 255.0,
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
    }
    assert list(recorded) == ["height", "width", "layout", "channels", "dtype", "scale", "mean", "std"]
    assert Preprocess.from_dict(json.loads(json.dumps(recorded))) == pre
