"""``icos-agent labels export`` and ``labels import``: the labeling sample out to Label Studio, its
annotations back in as delayed labels.

``export --format label-studio --out DIR`` reads the sampled, unlabeled predictions with their kept
inputs (``GET /v1/labels/requests?inputs=true``; the agent needs ``labels.keep_sampled_inputs``) and
writes ``DIR/tasks.json`` (Label Studio's JSON import: one task per prediction, the model's prediction
as a pre-annotation, the prediction id in ``data.icos_id`` so annotations find their way back),
``DIR/labeling_config.xml`` (an ``<Image>``, ``<Text>`` or ``<Table>`` and ``<Choices>`` of the model's
classes, and "None of these classes", exported as the label ``__none__``) and, for images,
``DIR/images/*.png`` referenced through ``--image-url-prefix`` (Label Studio's local files by default) or,
with ``--inline-images``, PNG data URIs in the tasks themselves.

``import FILE`` reads Label Studio's JSON export and posts one label per task: the choice of its newest
annotation (``updated_at``, then ``created_at``), skipped (cancelled) annotations ignored. A choice that
is not one of the model's classes stops the import before anything is sent, naming it.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import math
import struct
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from agent.core.label_values import NONE_LABEL
from agent.errors import UserError
from agent.labels.kept_inputs import decode_sample

CONTROL = "label"  # the name of the <Choices> control in the labeling config
MAX_IMPORT_BYTES = 256 << 20  # a larger export file is refused before it is read
MAX_SHOWN = 10  # unknown choices named in an error at most


def png(image: np.ndarray) -> bytes:
    """A PNG file of an ``[H, W]``, ``[H, W, 1|3|4]`` image; values other than uint8 are scaled to 0-255."""
    a = np.asarray(image)
    if a.dtype != np.uint8:
        f = a.astype(np.float64)
        lo, hi = float(np.nanmin(f)), float(np.nanmax(f))
        f = (f - lo) / (hi - lo) if hi > lo else np.zeros_like(f)
        a = np.nan_to_num(f * 255.0).round().astype(np.uint8)
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    color = {2: 0, 3: {3: 2, 4: 6}.get(a.shape[-1], -1)}[a.ndim]
    if color < 0:
        raise ValueError(f"not an image shape: {list(a.shape)}")
    raw = b"".join(b"\x00" + row.tobytes() for row in np.ascontiguousarray(a))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", a.shape[1], a.shape[0], 8, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def as_image(arrays: Mapping[str, np.ndarray], image_shape: tuple[int, ...] | None) -> np.ndarray | None:
    """The sample as an image ``[H, W(, C)]`` when it is one numeric input shaped like one (``image_shape``
    reshapes a flat vector, e.g. 8x8 for 64 pixels); None otherwise."""
    if len(arrays) != 1:
        return None
    a = next(iter(arrays.values()))
    if a.dtype.kind not in "biuf":
        return None
    a = np.squeeze(a) if a.ndim > 3 else a
    if image_shape is not None:
        if a.size != int(np.prod(image_shape)):
            shape = "x".join(map(str, image_shape))
            raise UserError(f"--image-shape {shape} does not fit inputs of shape {list(a.shape)}")
        a = a.reshape(image_shape)
    if a.ndim == 3 and a.shape[0] in (1, 3, 4) and a.shape[2] not in (1, 3, 4):
        a = np.moveaxis(a, 0, -1)  # channels first
    if a.ndim == 2 and min(a.shape) > 1 or a.ndim == 3 and a.shape[2] in (1, 3, 4):
        return a
    return None


def as_text(arrays: Mapping[str, np.ndarray]) -> str | None:
    """The sample as a text when it is one string input holding one string."""
    if len(arrays) != 1:
        return None
    a = next(iter(arrays.values()))
    return str(a.reshape(-1)[0]) if a.dtype == object and a.size == 1 else None


def as_table(arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The sample as one table row: a column per input (per element of a vector input, ``name[j]``)."""
    row: dict[str, Any] = {}
    for name, a in arrays.items():
        values = a.reshape(-1).tolist()
        if len(values) == 1:
            row[name] = values[0]
        else:
            row.update({f"{name}[{j}]": v for j, v in enumerate(values)})
    return row


#: The choice of an input that belongs to none of the model's classes: shown in words, exported as the
#: reserved label (:data:`~agent.core.label_values.NONE_LABEL`, Label Studio's ``alias``).
NONE_CHOICE = "None of these classes"


def labeling_config(kind: str, classes: list[str]) -> str:
    """Label Studio's labeling config: the object (``image``, ``text`` or ``table``), one choice per class and
    one for an input of none of them (exported as ``__none__``)."""
    tag = {"image": "Image", "text": "Text", "table": "Table"}[kind]
    rows = [f'    <Choice value="{_xml(c)}"/>' for c in classes]
    if NONE_LABEL not in classes:
        rows.append(f'    <Choice value="{NONE_CHOICE}" alias="{NONE_LABEL}"/>')
    choices = "\n".join(rows)
    return (
        f'<View>\n  <{tag} name="{kind}" value="${kind}"/>\n'
        f'  <Choices name="{CONTROL}" toName="{kind}" choice="single" showInLine="true">\n{choices}\n'
        "  </Choices>\n</View>\n"
    )


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


def export_tasks(
    listing: Mapping[str, Any],
    out: Path,
    *,
    inline_images: bool = False,
    image_shape: tuple[int, ...] | None = None,
    url_prefix: str = "/data/local-files/?d=",
) -> dict[str, Any]:
    """Write ``tasks.json``, ``labeling_config.xml`` and the images of a listing with inputs into ``out``;
    returns a summary (tasks written, predictions without kept inputs, the kind of object)."""
    classes = [str(c) for c in listing.get("classes", [])]
    tasks: list[dict[str, Any]] = []
    kinds: set[str] = set()
    without = 0
    for entry in listing.get("requests", []):
        if entry.get("inputs") is None:
            without += 1
            continue
        try:
            arrays = decode_sample(entry["inputs"])
        except (ValueError, TypeError) as exc:
            raise UserError(f"prediction {entry.get('id')}: the agent's inputs cannot be read: {exc}") from None
        data: dict[str, Any] = {"icos_id": entry["id"], "icos_timestamp": entry["timestamp"]}
        image = as_image(arrays, image_shape)
        text = as_text(arrays) if image is None else None
        if image is not None:
            kind, blob = "image", png(image)
            if inline_images:
                data[kind] = "data:image/png;base64," + base64.b64encode(blob).decode("ascii")
            else:
                name = f"images/{len(tasks):06d}.png"  # never a name from the request id: clients choose those
                (out / "images").mkdir(parents=True, exist_ok=True)
                (out / name).write_bytes(blob)
                data[kind] = url_prefix + name
        elif text is not None:
            kind, data["text"] = "text", text
        else:
            kind, data["table"] = "table", as_table(arrays)
        kinds.add(kind)
        task: dict[str, Any] = {"data": data}
        if entry.get("predicted") is not None:
            choice = {"choices": [str(entry["predicted"])]}
            result = {"from_name": CONTROL, "to_name": kind, "type": "choices", "value": choice}
            task["predictions"] = [
                {"model_version": "icos-agent", "score": entry.get("confidence"), "result": [result]}
            ]
        tasks.append(task)
    if len(kinds) > 1:
        raise UserError(f"the sampled inputs are of different kinds ({', '.join(sorted(kinds))}): export them apart")
    kind = kinds.pop() if kinds else "image"
    out.mkdir(parents=True, exist_ok=True)
    (out / "tasks.json").write_text(json.dumps(tasks, indent=1), encoding="utf-8")
    (out / "labeling_config.xml").write_text(labeling_config(kind, classes), encoding="utf-8")
    return {"tasks": len(tasks), "without_inputs": without, "kind": kind, "out": str(out)}


def _annotation_order(a: Mapping[str, Any]) -> tuple[float, int]:
    """Newer last: by ``updated_at`` (else ``created_at``, ISO 8601; unreadable: oldest), then by id."""
    when = a.get("updated_at") or a.get("created_at")
    try:
        t = datetime.datetime.fromisoformat(str(when)).timestamp() if isinstance(when, str) else -math.inf
    except ValueError:
        t = -math.inf
    ident = a.get("id")
    return t, ident if isinstance(ident, int) else -1


def _newest_choice(task: Mapping[str, Any]) -> list[str] | None:
    """The choices of the task's newest annotation that was not skipped (None: no such annotation)."""
    done = [a for a in task.get("annotations") or [] if isinstance(a, Mapping) and not a.get("was_cancelled")]
    if not done:
        return None
    newest = max(done, key=_annotation_order)
    for r in newest.get("result") or []:
        if isinstance(r, Mapping) and r.get("type") == "choices" and r.get("from_name", CONTROL) == CONTROL:
            value = r.get("value")
            choices = value.get("choices") if isinstance(value, Mapping) else None
            if isinstance(choices, list):
                return [str(c) for c in choices]
    return None


def labels_of_export(tasks: object, classes: list[str]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """``[{"id", "label"}]`` from a Label Studio JSON export, and counts (labeled, without annotation).
    Raises :class:`UserError` naming unknown choices, or a task that is not one of the agent's."""
    if not isinstance(tasks, list):
        raise UserError("not a Label Studio JSON export: expected a list of tasks")
    labels: list[dict[str, Any]] = []
    unknown: dict[str, int] = {}
    unlabeled = 0
    for n, task in enumerate(tasks):
        data = task.get("data") if isinstance(task, Mapping) else None
        pid = data.get("icos_id") if isinstance(data, Mapping) else None
        if not isinstance(pid, str):
            where = task.get("id") if isinstance(task, Mapping) else None
            raise UserError(f"task {n} (id {where}) has no data.icos_id: not a task exported by icos-agent")
        choices = _newest_choice(task)
        if not choices:
            unlabeled += 1
            continue
        if len(choices) != 1:
            raise UserError(f"task {n} ({pid}): {len(choices)} choices in one annotation; one class is expected")
        if choices[0] in (NONE_CHOICE, NONE_LABEL) and NONE_LABEL not in classes:
            labels.append({"id": pid, "label": NONE_LABEL})  # an alias-less export says it in words
            continue
        if choices[0] not in classes:
            unknown[choices[0]] = unknown.get(choices[0], 0) + 1
            continue
        labels.append({"id": pid, "label": choices[0]})
    if unknown:
        names = ", ".join(repr(c) for c in list(unknown)[:MAX_SHOWN])
        raise UserError(
            f"choices that are not classes of the model: {names} ({sum(unknown.values())} annotations); "
            f"the classes are {classes[:50]}. Nothing was sent"
        )
    return labels, {"labeled": len(labels), "without_annotation": unlabeled}


def read_export(path: Path) -> object:
    """The parsed JSON of a Label Studio export file (bounded in size)."""
    if not path.is_file():
        raise UserError(f"Label Studio export not found: {path}")
    if path.stat().st_size > MAX_IMPORT_BYTES:
        raise UserError(f"{path}: larger than {MAX_IMPORT_BYTES >> 20} MiB; export fewer tasks at a time")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not JSON: {exc}") from None


def image_shape_arg(text: str) -> tuple[int, ...]:
    """``8x8`` or ``28x28x1`` → a shape (argparse type)."""
    try:
        shape = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected e.g. 8x8 or 32x32x3") from None
    if not 2 <= len(shape) <= 3 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected e.g. 8x8 or 32x32x3")
    return shape
