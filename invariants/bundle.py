"""The invariant bundle: a directory holding a fitted oracle, without pickle or joblib.

Files (DESIGN.md, "Invariant bundle"):

* ``manifest.json`` — ``format_version``, ``model_sha256``, ``input_shape`` (without the batch
  axis), ``classes``, ``feature_names``, ``fit_params`` (the fields of
  :class:`~invariants.fit_params.FitParams` that apply to the bundle's source, by name, and the
  fit's counts; read back as a plain mapping, so a bundle that records fewer fields, as older ones
  do, loads the same), ``calibration`` (the oracle's TPR/FPR with counts),
  ``estimator_calibration`` (free numbers from the caller: the agent keeps there the estimators'
  calibration and, each an optional part with its own format tag that a reader of another version
  ignores, ``shift_aware``'s models, the headline's evidence and the segments fixed at fit), ``files``
  (sha256 of every other file), ``created_at`` and ``manifest_sha256`` (digest of the manifest's own canonical JSON
  without that key, so an edited manifest is refused as well); ``entries_sha256`` (the digest of each
  entry, the parts of ``estimator_calibration`` (segments, ...) each on its own, so that a refused manifest
  names what changed: ``manifest.json: sha256 mismatch ('pair' changed) ...``; absent from bundles saved
  before it, which are refused without naming the entry);
  Optional keys, written only when set: ``table`` (a bundle
  fitted from a table of features and predicted probabilities rather than an ONNX model:
  ``proba_columns``, ``feature_columns``, ``label_column``; ``model_sha256`` is then null),
  ``decision_threshold`` (binary models: class 1 is predicted from this probability on),
  ``headline`` (the estimator reports show first, when not the default one), ``inputs`` (the model's
  inputs: name, V2 datatype and shape per sample of each, for models other than a single numeric
  input), ``feature_view`` (what the invariants read of a sample: chosen at ``fit`` and interpreted
  by the agent; without it, the single input's raw values) and ``preprocess`` (how an image file
  became the model's input at ``fit``: size, scale, mean/std, layout; the same at ``check``) and ``pair``
  (a challenger's comparison with a champion, fitted with ``fit --champion``: the champion's digest and
  the paired difference's calibration, a JSON object the agent interprets);
* ``idi.yaml`` — only when IDIs exist;
* ``tdi.json`` — the tree arrays and the leaf table;
* ``adi.onnx`` — the random forest.

Loading verifies every digest before parsing anything and, when asked, that the bundle was
fitted for the given model.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from invariants.adi import AlgorithmInvariants
from invariants.fitting import FittedOracle
from invariants.idi import IdiRuleError, IdiRuleSet
from invariants.onnx_session import OnnxLoadError
from invariants.oracle import Oracle, OracleCalibration
from invariants.tdi import TrainingInvariants

__all__ = ["FORMAT_VERSION", "Bundle", "BundleError", "TableSource", "sha256_bytes", "sha256_file"]

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
#: the largest file a bundle may hold (a 1,000-tree ADI forest is a few MB)
MAX_FILE_BYTES = 512 * 1024 * 1024
IDI_FILE = "idi.yaml"
TDI_FILE = "tdi.json"
ADI_FILE = "adi.onnx"
_PAYLOAD_FILES = (IDI_FILE, TDI_FILE, ADI_FILE)
#: The manifest's key of its entries' own digests (:func:`_entry_digests`).
ENTRIES_KEY = "entries_sha256"
_REQUIRED_KEYS = (
    "format_version",
    "model_sha256",
    "input_shape",
    "classes",
    "feature_names",
    "fit_params",
    "calibration",
    "estimator_calibration",
    "files",
    "created_at",
    "manifest_sha256",
)


class BundleError(ValueError):
    """A bundle cannot be written or read; one line naming the file and the problem."""


@dataclass(frozen=True)
class TableSource:
    """Where a table-based bundle reads a model's behaviour: the columns of its tables."""

    proba_columns: tuple[str, ...]
    feature_columns: tuple[str, ...]
    label_column: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "proba_columns": list(self.proba_columns),
            "feature_columns": list(self.feature_columns),
            "label_column": self.label_column,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TableSource:
        probas, feats, label = d.get("proba_columns"), d.get("feature_columns"), d.get("label_column")
        if not isinstance(probas, list) or not probas or not all(isinstance(c, str) for c in probas):
            raise BundleError(f"{MANIFEST}: 'table.proba_columns' must be a non-empty list of column names")
        if not isinstance(feats, list) or not all(isinstance(c, str) for c in feats):
            raise BundleError(f"{MANIFEST}: 'table.feature_columns' must be a list of column names")
        if label is not None and not isinstance(label, str):
            raise BundleError(f"{MANIFEST}: 'table.label_column' must be a column name or null")
        return cls(tuple(probas), tuple(feats), label)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdefABCDEF" for c in value)


def _short(digest: str) -> str:
    return digest[:12] + "…" if len(digest) > 12 else digest


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _canonical(data: Mapping[str, Any]) -> str:
    """The one serialisation of a manifest: sorted keys, 2-space indent, strict JSON."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=True, allow_nan=False, default=_json_default)


def _manifest_digest(manifest: Mapping[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return sha256_bytes(_canonical(body).encode("ascii"))


def _entries(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's entries by name: every key but the digests, and each part of ``estimator_calibration``
    as ``estimator_calibration.<part>`` (the segments, ``shift_aware``'s models, ...) besides the whole."""
    out = {k: v for k, v in manifest.items() if k not in ("manifest_sha256", ENTRIES_KEY)}
    parts = manifest.get("estimator_calibration")
    if isinstance(parts, Mapping):
        out.update({f"estimator_calibration.{k}": v for k, v in parts.items()})
    return out


def _entry_digests(manifest: Mapping[str, Any]) -> dict[str, str]:
    """The sha256 of each entry's canonical JSON (:func:`_entries`): what lets a refused manifest name the
    entries that changed."""
    return {k: sha256_bytes(_canonical({"v": v}).encode("ascii")) for k, v in sorted(_entries(manifest).items())}


def _named(key: str, limit: int = 60) -> str:
    """An entry's name as an error shows it: quoted, and cut (a forged manifest chooses its keys)."""
    return repr(key if len(key) <= limit else key[: limit - 1] + "…")


def _changed_entries(manifest: Mapping[str, Any]) -> list[str]:
    """The entries whose digest differs from the one written at save (added and removed ones too); empty
    when the manifest has no entry digests (written before them) or none differs."""
    written = manifest.get(ENTRIES_KEY)
    if not isinstance(written, Mapping):
        return []
    now = _entry_digests(manifest)
    changed = [f"{_named(k)} changed" for k in sorted(now.keys() & written.keys()) if now[k] != written[k]]
    changed += [f"{_named(k)} removed" for k in sorted(written.keys() - now.keys())]
    changed += [f"{_named(k)} added" for k in sorted(now.keys() - written.keys())]
    whole = [c for c in changed if not c.startswith("'estimator_calibration' ")]
    return whole if any(c.startswith("'estimator_calibration.") for c in whole) else changed


@dataclass
class Bundle:
    """Everything needed to run a fitted oracle beside one model (``model_sha256``), or on the tables
    of a model's predictions (``table``, no model file)."""

    model_sha256: str | None
    input_shape: list[int | None]
    classes: list[str]
    feature_names: list[str] | None
    fit_params: dict[str, Any]
    idi: IdiRuleSet | None
    tdi: TrainingInvariants
    adi: AlgorithmInvariants
    calibration: OracleCalibration
    estimator_calibration: dict[str, Any] = field(default_factory=dict)
    created_at: str | None = None
    table: TableSource | None = None
    decision_threshold: float | None = None
    headline: str | None = None
    #: the model's inputs (``[{"name", "datatype", "shape"}]``), kept when not a single numeric input
    inputs: list[dict[str, Any]] | None = None
    #: the feature view the invariants read (a JSON object the agent interprets)
    feature_view: dict[str, Any] | None = None
    #: how image files became the model's input at fit (a JSON object the agent interprets)
    preprocess: dict[str, Any] | None = None
    #: this model as a challenger of a champion: the paired difference's calibration (a JSON object the
    #: agent interprets)
    pair: dict[str, Any] | None = None

    @classmethod
    def from_fitted(
        cls,
        fitted: FittedOracle,
        *,
        model_sha256: str,
        input_shape: Sequence[int | None],
        classes: Sequence[str],
        feature_names: Sequence[str] | None = None,
        estimator_calibration: Mapping[str, Any] | None = None,
    ) -> Bundle:
        """Wrap the result of :func:`~invariants.fitting.fit_oracle`."""
        oracle = fitted.oracle
        if oracle.tdi is None or oracle.adi is None:
            raise BundleError("a bundle needs both training- and algorithm-dependent invariants")
        return cls(
            model_sha256=model_sha256,
            input_shape=list(input_shape),
            classes=[str(c) for c in classes],
            feature_names=list(feature_names) if feature_names is not None else None,
            fit_params=dict(fitted.fit_params),
            idi=oracle.idi,
            tdi=oracle.tdi,
            adi=oracle.adi,
            calibration=fitted.calibration,
            estimator_calibration=dict(estimator_calibration or {}),
        )

    def oracle(self) -> Oracle:
        return Oracle(self.idi, self.tdi, self.adi)

    # -- writing --------------------------------------------------------------------------

    def _payload(self) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        if self.idi is not None and self.idi.rules:
            files[IDI_FILE] = self.idi.to_yaml().encode("utf-8")
        files[TDI_FILE] = (json.dumps(self.tdi.to_dict(), allow_nan=False, separators=(",", ":")) + "\n").encode(
            "ascii"
        )
        files[ADI_FILE] = self.adi.onnx_bytes
        return files

    def manifest(self, files: Mapping[str, str], *, created_at: str | None = None) -> dict[str, Any]:
        """The manifest for the given ``{file: sha256}`` (``created_at`` defaults to :attr:`created_at`)."""
        manifest: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "model_sha256": self.model_sha256,
            "input_shape": list(self.input_shape),
            "classes": list(self.classes),
            "feature_names": list(self.feature_names) if self.feature_names is not None else None,
            "fit_params": self.fit_params,
            "calibration": self.calibration.to_dict(),
            "estimator_calibration": self.estimator_calibration,
            "files": dict(sorted(files.items())),
            "created_at": created_at if created_at is not None else self.created_at,
        }
        if self.table is not None:
            manifest["table"] = self.table.to_dict()
        if self.decision_threshold is not None:
            manifest["decision_threshold"] = float(self.decision_threshold)
        if self.headline is not None:
            manifest["headline"] = self.headline
        if self.inputs is not None:
            manifest["inputs"] = list(self.inputs)
        if self.feature_view is not None:
            manifest["feature_view"] = dict(self.feature_view)
        if self.preprocess is not None:
            manifest["preprocess"] = dict(self.preprocess)
        if self.pair is not None:
            manifest["pair"] = dict(self.pair)
        manifest[ENTRIES_KEY] = _entry_digests(manifest)
        manifest["manifest_sha256"] = _manifest_digest(manifest)
        return manifest

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the bundle atomically (temp dir beside the target, then rename), replacing an
        existing bundle directory. Sets :attr:`created_at` (when unset) once the bundle is written.

        A reader that opens the directory during the replacement may briefly find it missing;
        it never finds a half-written bundle."""
        target = Path(directory)
        if self.table is None and not _is_sha256(self.model_sha256):
            raise BundleError(f"{MANIFEST}: model_sha256 must be a hex sha256 digest, got {self.model_sha256!r}")
        if self.table is not None and self.model_sha256 is not None:
            raise BundleError(f"{MANIFEST}: a table-based bundle has no model_sha256")
        _check_threshold(self.decision_threshold, len(self.classes))
        if target.exists() and not (target.is_dir() and (not any(target.iterdir()) or (target / MANIFEST).exists())):
            raise BundleError(f"{target}: exists and is not an invariant bundle; refusing to overwrite it")
        created_at = self.created_at or _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()
        payload = self._payload()
        digests = {name: sha256_bytes(data) for name, data in payload.items()}
        try:
            text = _canonical(self.manifest(digests, created_at=created_at)) + "\n"
        except (TypeError, ValueError) as exc:
            raise BundleError(f"{MANIFEST}: cannot serialise the manifest ({exc})") from exc
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        except OSError as exc:
            raise BundleError(f"{target}: cannot write the bundle ({exc.strerror or exc})") from exc
        try:
            for name, data in payload.items():
                (staging / name).write_bytes(data)
            (staging / MANIFEST).write_text(text, encoding="ascii")
            for name in (*payload, MANIFEST):
                with open(staging / name, "rb") as handle:
                    os.fsync(handle.fileno())
            if target.exists():
                retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
                retired.rmdir()
                os.replace(target, retired)
                try:
                    os.replace(staging, target)
                except OSError:
                    os.replace(retired, target)  # put the previous bundle back
                    raise
                shutil.rmtree(retired, ignore_errors=True)
            else:
                os.replace(staging, target)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise BundleError(f"{target}: cannot write the bundle ({exc.strerror or exc})") from exc
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self.created_at = created_at
        return target

    # -- reading --------------------------------------------------------------------------

    @staticmethod
    def table_source(directory: str | os.PathLike[str]) -> TableSource | None:
        """The table columns of a table-based bundle, None for a model's bundle; reads only the
        (verified) manifest, so a caller can tell the two kinds apart before loading either."""
        root = Path(directory)
        if not root.is_dir():
            raise BundleError(f"{root}: no such bundle directory")
        manifest = _read_manifest(root)
        return TableSource.from_dict(manifest["table"]) if "table" in manifest else None

    @classmethod
    def load(cls, directory: str | os.PathLike[str], *, expected_model_sha256: str | None = None) -> Bundle:
        """Read a bundle, verifying the manifest and every file digest before parsing any file."""
        root = Path(directory)
        if not root.is_dir():
            raise BundleError(f"{root}: no such bundle directory")
        manifest = _read_manifest(root)
        files = manifest["files"]
        blobs: dict[str, bytes] = {}
        for name in _PAYLOAD_FILES:
            if name not in files:
                continue
            path = _contained(root, name)
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise BundleError(f"{name}: cannot read ({exc.strerror or exc})") from exc
            if sha256_bytes(data) != files[name]:
                raise BundleError(f"{name}: sha256 mismatch (bundle tampered or corrupted)")
            blobs[name] = data
        table = TableSource.from_dict(manifest["table"]) if "table" in manifest else None
        if expected_model_sha256 is not None and table is not None:
            raise BundleError(
                f"{root} was fitted from a table of predictions, not for a model; use it without --model "
                "(or refit it with `icos-agent fit --model`)"
            )
        if expected_model_sha256 is not None and expected_model_sha256.lower() != manifest["model_sha256"].lower():
            raise BundleError(
                f"bundle was fitted for model sha256 {_short(manifest['model_sha256'])} "
                f"but the model is {_short(expected_model_sha256)}: refit it for this model "
                "(`icos-agent fit --model <this model> ...`), or use the model it was fitted for"
            )
        classes = manifest["classes"]
        feature_names = manifest["feature_names"]

        idi = None
        if IDI_FILE in blobs:
            try:
                idi = IdiRuleSet.from_yaml(blobs[IDI_FILE].decode("utf-8"), classes)
            except (IdiRuleError, UnicodeDecodeError) as exc:
                raise BundleError(f"{IDI_FILE}: {exc}") from exc
        try:
            tdi = TrainingInvariants.from_dict(json.loads(blobs[TDI_FILE].decode("utf-8")))
        except json.JSONDecodeError as exc:
            raise BundleError(f"{TDI_FILE}: malformed JSON ({exc})") from exc
        except (ValueError, UnicodeDecodeError) as exc:
            raise BundleError(f"{TDI_FILE}: {exc}") from exc
        try:
            adi = AlgorithmInvariants.from_onnx(blobs[ADI_FILE])
        except (OnnxLoadError, ValueError) as exc:
            raise BundleError(f"{ADI_FILE}: {exc}") from exc
        try:
            calibration = OracleCalibration.from_dict(manifest["calibration"])
        except ValueError as exc:
            raise BundleError(f"{MANIFEST}: {exc}") from exc
        return cls(
            model_sha256=manifest["model_sha256"],
            input_shape=list(manifest["input_shape"]),
            classes=list(classes),
            feature_names=list(feature_names) if feature_names is not None else None,
            fit_params=dict(manifest["fit_params"]),
            idi=idi,
            tdi=tdi,
            adi=adi,
            calibration=calibration,
            estimator_calibration=dict(manifest["estimator_calibration"]),
            created_at=manifest["created_at"],
            table=table,
            decision_threshold=manifest.get("decision_threshold"),
            headline=manifest.get("headline"),
            inputs=manifest.get("inputs"),
            feature_view=manifest.get("feature_view"),
            preprocess=manifest.get("preprocess"),
            pair=manifest.get("pair"),
        )


def _check_threshold(value: object, n_classes: int) -> None:
    """A decision threshold is a probability strictly inside (0, 1), for a binary model only."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) < 1.0:
        raise BundleError(f"'decision_threshold' must be a probability strictly between 0 and 1, got {value!r}")
    if n_classes != 2:
        raise BundleError(f"'decision_threshold' applies to binary models only; this one has {n_classes} classes")


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def _contained(root: Path, name: str) -> Path:
    """``root / name`` if it is a regular file that resolves inside ``root``: a link in a bundle may point
    within it (Kubernetes volumes are built of such links) but never out of it, where
    ``security.allowed_roots`` would not reach (``/etc/shadow``, ``/dev/zero``)."""
    path = root / name
    if not path.is_file():
        raise BundleError(f"{name}: missing file")
    real, real_root = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    if not real.is_relative_to(real_root):
        raise BundleError(f"{name}: a link that leads outside the bundle directory")
    size = real.stat().st_size
    if size > MAX_FILE_BYTES:
        raise BundleError(f"{name}: {size} bytes, more than a bundle file may hold ({MAX_FILE_BYTES})")
    return path


def _read_manifest(root: Path) -> dict[str, Any]:
    path = _contained(root, MANIFEST)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BundleError(f"{MANIFEST}: cannot read ({exc.strerror or exc})") from exc
    try:
        manifest = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise BundleError(f"{MANIFEST}: malformed JSON ({exc})") from exc
    if not isinstance(manifest, dict):
        raise BundleError(f"{MANIFEST}: malformed JSON (expected an object)")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise BundleError(f"{MANIFEST}: unsupported format_version {version!r} (this version reads {FORMAT_VERSION})")
    for key in _REQUIRED_KEYS:
        if key not in manifest:
            raise BundleError(f"{MANIFEST}: missing key {key!r}")
    if manifest["manifest_sha256"] != _manifest_digest(manifest):
        changed = _changed_entries(manifest)
        where = f" ({', '.join(changed[:8])}{', ...' if len(changed) > 8 else ''})" if changed else ""
        raise BundleError(f"{MANIFEST}: sha256 mismatch{where} (bundle tampered or corrupted)")
    if raw.decode("utf-8") != _canonical(manifest) + "\n":
        raise BundleError(f"{MANIFEST}: not in canonical form (bundle tampered or corrupted)")
    _check_manifest_types(manifest)
    return manifest


def _check_manifest_types(manifest: Mapping[str, Any]) -> None:
    def bad(key: str, expected: str) -> BundleError:
        return BundleError(f"{MANIFEST}: {key!r} must be {expected}")

    if "table" in manifest:
        if manifest["model_sha256"] is not None:
            raise bad("model_sha256", "null in a table-based bundle")
        if not isinstance(manifest["table"], dict):
            raise bad("table", "an object")
    elif not _is_sha256(manifest["model_sha256"]):
        raise bad("model_sha256", "a hex sha256 digest")
    if "headline" in manifest and not isinstance(manifest["headline"], str):
        raise bad("headline", "an estimator name")
    inputs = manifest.get("inputs")
    if inputs is not None and (
        not isinstance(inputs, list)
        or not inputs
        or not all(
            isinstance(i, dict) and isinstance(i.get("name"), str) and isinstance(i.get("shape"), list) for i in inputs
        )
    ):
        raise bad("inputs", "a list of {name, datatype, shape} objects")
    for key in ("feature_view", "preprocess", "pair"):
        if key in manifest and not isinstance(manifest[key], dict):
            raise bad(key, "an object")
    if "decision_threshold" in manifest:
        classes_ = manifest["classes"]
        try:
            _check_threshold(manifest["decision_threshold"], len(classes_) if isinstance(classes_, list) else 0)
        except BundleError as exc:
            raise BundleError(f"{MANIFEST}: {exc}") from None
    shape = manifest["input_shape"]
    if not isinstance(shape, list) or not all(
        d is None or (isinstance(d, int) and not isinstance(d, bool) and d > 0) for d in shape
    ):
        raise bad("input_shape", "a list of positive integers (or null for a dynamic axis)")
    classes = manifest["classes"]
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        raise bad("classes", "a non-empty list of strings")
    names = manifest["feature_names"]
    if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
        raise bad("feature_names", "a list of strings or null")
    for key in ("fit_params", "calibration", "estimator_calibration"):
        if not isinstance(manifest[key], dict):
            raise bad(key, "an object")
    files = manifest["files"]
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise bad("files", "an object of file name to sha256")
    unknown = [name for name in files if name not in _PAYLOAD_FILES]
    if unknown:
        raise BundleError(f"{MANIFEST}: unexpected file {unknown[0]!r} in 'files'")
    for name in (TDI_FILE, ADI_FILE):
        if name not in files:
            raise BundleError(f"{MANIFEST}: 'files' does not list {name}")
    if manifest["created_at"] is not None and not isinstance(manifest["created_at"], str):
        raise bad("created_at", "a timestamp string")
