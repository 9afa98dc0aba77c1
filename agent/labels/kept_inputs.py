"""The inputs of sampled predictions, kept for labeling (``labels.keep_sampled_inputs``).

A labeler needs what the model saw: the image, the text, the table row. When the setting is on, the
prediction store keeps the inputs of every prediction drawn into the labeling sample in a table of its
own (``inputs``, ``icos_inputs`` in PostgreSQL), one row per prediction keyed by its request row and
index, with the predicted class and its probability (the pre-annotation a labeling tool shows). The
inputs are user data: an encoded input over ``labels.max_kept_input_bytes`` is not kept, and past
``labels.max_kept_inputs_bytes`` for the whole table the oldest are dropped first; both are counted.

The encoding is JSON, one object per prediction: input name → its array as :mod:`agent.core.array_json`
encodes it, ``{"dtype": "float32", "shape": [8, 8], "base64": "<little-endian bytes>"}`` for numeric arrays (bool
included) and ``{"dtype": "string", "shape": [...], "values": ["..."]}`` for text (bytes decoded as
UTF-8, undecodable bytes replaced). ``shape`` is the shape of one sample (the batch axis removed).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.config.settings import LabelsConfig
from agent.core.array_json import decode_array, encode_array

#: SQLite: the table, and triggers so that a deleted or cut request row takes its inputs along
SQLITE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS inputs (seq INTEGER NOT NULL, idx INTEGER NOT NULL, nbytes INTEGER NOT NULL,"
    " predicted INTEGER NOT NULL, confidence REAL NOT NULL, data TEXT NOT NULL, PRIMARY KEY(seq, idx))",
    "CREATE TRIGGER IF NOT EXISTS inputs_of_deleted AFTER DELETE ON requests"
    " BEGIN DELETE FROM inputs WHERE seq = OLD.seq; END",
    "CREATE TRIGGER IF NOT EXISTS inputs_of_cut AFTER UPDATE OF lo ON requests"
    " BEGIN DELETE FROM inputs WHERE seq = NEW.seq AND idx < NEW.lo; END",
)


@dataclass(frozen=True)
class KeptInput:
    """One prediction's inputs to keep: its request, index, prediction and encoded inputs."""

    request_id: str
    index: int
    predicted: int
    confidence: float
    data: str


_LABELS = LabelsConfig.model_fields


@dataclass(frozen=True)
class KeptInputsPolicy:
    """Whether inputs are kept, and the byte bounds (the ``labels.*`` settings; their defaults)."""

    enabled: bool = _LABELS["keep_sampled_inputs"].default
    max_input_bytes: int = _LABELS["max_kept_input_bytes"].default
    max_total_bytes: int = _LABELS["max_kept_inputs_bytes"].default

    @classmethod
    def of(cls, config: LabelsConfig) -> KeptInputsPolicy:
        """The policy of ``labels`` settings."""
        return cls(config.keep_sampled_inputs, config.max_kept_input_bytes, config.max_kept_inputs_bytes)


def encode_sample(inputs: Mapping[str, np.ndarray], index: int) -> str:
    """The JSON encoding of sample ``index`` of a batch of inputs (see the module docstring)."""
    one = {name: encode_array(np.asarray(np.asarray(a)[index])) for name, a in inputs.items()}
    return json.dumps(one, separators=(",", ":"))


def decode_sample(obj: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The arrays of one encoded sample (as parsed JSON); raises ``ValueError`` for anything else."""
    out: dict[str, np.ndarray] = {}
    for name, enc in obj.items():
        out[name] = decode_array(enc, f"input {name!r}")
    return out


def kept_inputs(
    request_id: str,
    inputs: Mapping[str, np.ndarray] | None,
    sampled: np.ndarray | None,
    predicted: np.ndarray,
    probabilities: np.ndarray,
    max_bytes: int,
) -> tuple[list[KeptInput], int]:
    """The inputs of a request's sampled predictions within ``max_bytes`` each, and how many were too large."""
    if inputs is None or sampled is None or not np.size(sampled) or not len(inputs):
        return [], 0
    probs = np.asarray(probabilities).reshape(len(predicted), -1)
    kept: list[KeptInput] = []
    too_large = 0
    for i in np.asarray(sampled).reshape(-1).tolist():
        # an input far over the bound is refused before it is encoded (base64 adds a third)
        if sum(int(np.asarray(a)[i].nbytes) for a in inputs.values()) > max_bytes:
            too_large += 1
            continue
        data = encode_sample(inputs, i)
        if len(data) > max_bytes:
            too_large += 1
            continue
        k = int(predicted[i])
        kept.append(KeptInput(request_id, int(i), k, float(probs[i, k]) if 0 <= k < probs.shape[1] else 0.0, data))
    return kept, too_large


#: Delete the oldest kept inputs (by request row, then index) that together cover ``excess`` bytes: those
#: whose older rows hold fewer than ``excess`` bytes. One statement (a window sum), in either database.
EVICT_OLDEST = (
    "DELETE FROM {table} WHERE (seq, idx) IN (SELECT seq, idx FROM (SELECT seq, idx,"
    " SUM(nbytes) OVER (ORDER BY seq, idx) - nbytes AS older FROM {table}) AS o WHERE older < {mark})"
)


#: ``(prediction id) → (predicted class, confidence, encoded inputs)`` of kept inputs
KeptMap = dict[str, tuple[int, float, str]]


class SQLiteKeptInputs:
    """The statements of the SQLite ``inputs`` table (run by the backend under its lock)."""

    @staticmethod
    def init(db: sqlite3.Connection) -> None:
        for stmt in SQLITE_SCHEMA:
            db.execute(stmt)

    @staticmethod
    def write(db: sqlite3.Connection, rows: Sequence[KeptInput], max_total: int) -> int:
        """Insert ``rows`` (in the caller's transaction), then drop the oldest past ``max_total`` bytes;
        returns how many were dropped."""
        rids = sorted({r.request_id for r in rows})
        seqs: dict[str, int] = {}
        for first in range(0, len(rids), 500):
            chunk = rids[first : first + 500]
            marks = ",".join("?" * len(chunk))
            seqs.update(
                (str(rid), int(seq))
                for rid, seq in db.execute(
                    f"SELECT rid, MAX(seq) FROM requests WHERE rid IN ({marks}) GROUP BY rid",  # noqa: S608
                    chunk,
                )
            )
        db.executemany(
            "INSERT OR REPLACE INTO inputs(seq, idx, nbytes, predicted, confidence, data) VALUES(?, ?, ?, ?, ?, ?)",
            [
                (seqs[r.request_id], r.index, len(r.data), r.predicted, r.confidence, r.data)
                for r in rows
                if r.request_id in seqs
            ],
        )
        (total,) = db.execute("SELECT COALESCE(SUM(nbytes), 0) FROM inputs").fetchone()
        excess = int(total) - max_total
        if excess <= 0:
            return 0
        return int(db.execute(EVICT_OLDEST.format(table="inputs", mark="?"), (excess,)).rowcount)

    @staticmethod
    def read(db: sqlite3.Connection, ids: Sequence[str]) -> KeptMap:
        """The kept inputs of these prediction ids (those that have some)."""
        wanted: dict[str, set[int]] = {}
        for pid in ids:
            rid, _, idx = pid.rpartition(":")
            wanted.setdefault(rid, set()).add(int(idx))
        out: KeptMap = {}
        rids = list(wanted)
        for first in range(0, len(rids), 500):
            chunk = rids[first : first + 500]
            marks = ",".join("?" * len(chunk))
            for rid, idx, predicted, confidence, data in db.execute(
                "SELECT r.rid, i.idx, i.predicted, i.confidence, i.data FROM inputs i JOIN requests r"
                f" ON r.seq = i.seq WHERE r.rid IN ({marks})",  # noqa: S608 - placeholders only
                chunk,
            ):
                if int(idx) in wanted[str(rid)]:
                    out[f"{rid}:{idx}"] = (int(predicted), float(confidence), str(data))
        return out
