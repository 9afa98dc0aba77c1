"""Numpy arrays inside JSON documents, as their bytes: ``{"dtype": "float32", "shape": [8, 8], "base64":
"<little-endian bytes>"}`` for numeric arrays (bool included), ``{"dtype": "string", "shape": [...], "values":
["..."]}`` for text (bytes decoded as UTF-8, undecodable bytes replaced).

A numeric array as a JSON list costs a Python object per number while it is written or read (tens of bytes each)
and its decimal text; as base64 it costs a third more than its own bytes, and reads back bit for bit. The kept
inputs of the labeling sample and the count window's saved columns use it.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def encode_array(a: np.ndarray) -> dict[str, Any]:
    """The JSON object of ``a`` (see the module docstring)."""
    if a.dtype.kind in "USO":
        values = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in a.reshape(-1).tolist()]
        return {"dtype": "string", "shape": list(a.shape), "values": values}
    le = a.astype(a.dtype.newbyteorder("<"), copy=False)
    raw = np.ascontiguousarray(le).tobytes()
    return {"dtype": a.dtype.name, "shape": list(a.shape), "base64": base64.b64encode(raw).decode("ascii")}


def is_encoded(value: Any) -> bool:
    """Whether ``value`` (parsed JSON) is an encoded array rather than, e.g., a plain list of numbers."""
    return isinstance(value, Mapping) and isinstance(value.get("shape"), list) and "dtype" in value


def decode_array(enc: Any, what: str = "array") -> np.ndarray:
    """The array of an encoded one (as parsed JSON; numeric ones read-only, in native byte order); raises
    ``ValueError`` naming ``what`` for anything else, a byte count that does not fit its shape included."""
    if not is_encoded(enc):
        raise ValueError(f"{what}: not an encoded array")
    try:
        shape = tuple(int(d) for d in enc["shape"])
    except (TypeError, ValueError):
        raise ValueError(f"{what}: its shape is not a list of integers") from None
    if any(d < 0 for d in shape):
        raise ValueError(f"{what}: negative dimension in shape {list(shape)}")
    if enc.get("dtype") == "string":
        values = enc.get("values")
        if not isinstance(values, list) or len(values) != math.prod(shape):
            raise ValueError(f"{what}: its values do not fill shape {list(shape)}")
        return np.asarray([str(v) for v in values], dtype=object).reshape(shape)
    try:
        dtype = np.dtype(str(enc.get("dtype"))).newbyteorder("<")
    except TypeError:
        raise ValueError(f"{what}: dtype {enc.get('dtype')!r} is not a numpy dtype") from None
    if dtype.kind not in "biuf":
        raise ValueError(f"{what}: dtype {enc.get('dtype')!r} is not numeric")
    try:
        raw = base64.b64decode(str(enc.get("base64", "")), validate=True)
    except ValueError:
        raise ValueError(f"{what}: its bytes are not base64") from None
    if len(raw) != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"{what}: {len(raw)} bytes do not fill shape {list(shape)} of {dtype.name}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="), copy=False)
