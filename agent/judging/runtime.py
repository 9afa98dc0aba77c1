"""What is loaded for one model + bundle: :class:`Runtime` and :func:`load_runtime`.

A runtime is immutable and swapped as a whole on reload, so a request in flight keeps the runtime
it started with. It holds the classifier (serve mode) or the input description (proxy/observe), the
bundle with its compiled oracle, and the estimator calibration.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.config.settings import AgentSettings
from agent.errors import UserError
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import RECOMMENDED_ESTIMATOR, headline_estimator
from agent.model.classifier import (
    Batch,
    ModelLoadError,
    OnnxClassifier,
    Prediction,
    onnx_problem,
    predicted_classes_of,
    read_model_file,
    scores_as_probabilities,
    sha256_bytes,
)
from agent.model.inputs import Inputs, Signature, prepare
from agent.model.views import FeatureView, ViewError, view_of_bundle
from agent.protocol import v2
from agent.protocol.v2 import ProtocolError
from invariants.bundle import Bundle, BundleError
from invariants.compiled import CompiledOracle


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Runtime:
    """A loaded model (serve mode) or input description (proxy/observe) with its bundle."""

    name: str
    version: str
    mode: str
    classifier: OnnxClassifier | None
    #: the model's single input's name (None: several inputs, or unknown without the model)
    input_name: str | None
    input_shape: tuple[int, ...]
    classes: list[str]
    bundle: Bundle
    oracle: CompiledOracle
    calibration: EstimatorCalibration
    metadata_fields: frozenset[str]
    model_sha256: str
    bundle_digest: str
    scores_kind: str
    max_batch: int
    model_path: str | None = None
    bundle_path: str | None = None
    #: The oracle for batches without metadata: IDI rules that only read metadata cannot fire then.
    oracle_no_metadata: CompiledOracle | None = None
    #: Bound on the elements of one request tensor (``server.max_tensor_elements``).
    max_elements: int = v2.DEFAULT_MAX_ELEMENTS
    #: Bound on one value of a per-sample metadata input (``server.max_metadata_value_bytes``).
    max_metadata_value_bytes: int = 1024
    #: Binary models: class 1 is predicted from this probability on (the bundle's); None is argmax.
    decision_threshold: float | None = None
    #: The estimator shown first (the bundle's headline, the recommended one unless it says otherwise).
    headline: str = RECOMMENDED_ESTIMATOR
    #: Model inputs the IDI rules read (``{input: ...}`` conditions), passed with the metadata.
    input_fields: frozenset[str] = frozenset()
    #: The model's inputs (from the model in serve mode, from the bundle otherwise).
    signature: Signature = field(default_factory=lambda: Signature(()))
    #: What the invariants read of a sample (the bundle's feature view).
    view: FeatureView = field(default_factory=lambda: FeatureView("raw"))

    @functools.cached_property
    def identity(self) -> str:
        """What the estimator windows belong to: the model and the bundle judging it."""
        return f"{self.model_sha256[:16]}:{self.bundle_digest[:16]}"

    @functools.cached_property
    def bundle_label(self) -> str:
        """The ``bundle`` label of the exported window statistics: the manifest digest's first 16 hex
        digits (one value per bundle; the fleet evaluator refuses to add statistics of two)."""
        return self.bundle_digest[:16]

    @property
    def n_features(self) -> int:
        """Columns of the feature view."""
        return self.view.width

    def prepare(self, x: Batch) -> Inputs:
        """Validate a batch; raises :class:`agent.model.inputs.InvalidInput` naming the problem."""
        if self.classifier is not None:
            return self.classifier.prepare(x)
        return prepare(self.signature, x, self.max_batch)

    def features(self, x: Inputs, prediction: Prediction | None = None) -> np.ndarray:
        """The feature view of prepared inputs (an embedding view reads it from ``prediction``)."""
        if self.classifier is not None:
            return self.classifier.features(x, prediction)
        return self.view.features(x)

    def predicted_classes(self, probabilities: np.ndarray) -> np.ndarray:
        """The predicted classes of probabilities from elsewhere (proxy, observe), with the bundle's threshold."""
        return predicted_classes_of(probabilities, self.decision_threshold)

    def to_probabilities(self, scores: np.ndarray, what: str) -> np.ndarray:
        """Scores from another server → probabilities ``[N, K]`` (softmax for logits)."""
        s = np.asarray(scores)
        if s.dtype.kind not in "fiu":
            raise ProtocolError("scores", f"{what} is not numeric")
        with np.errstate(over="ignore"):  # beyond float32 → ±inf, refused just below
            s = s.astype(np.float32).reshape(len(s), -1) if s.ndim >= 1 and len(s) else s.astype(np.float32)
        if s.ndim != 2 or s.shape[1] != len(self.classes):
            raise ProtocolError(
                "scores", f"{what} has shape {list(np.shape(scores))}; expected [N, {len(self.classes)}]"
            )
        if not np.isfinite(s).all():
            raise ProtocolError("scores", f"{what} holds NaN or Inf values (or values beyond the float32 range)")
        return scores_as_probabilities(s, self.scores_kind)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "mode": self.mode,
            "sha256": self.model_sha256,
            "bundle_digest": self.bundle_digest,
            "input": {"name": self.input_name, "shape": [-1, *self.input_shape]},
            "classes": self.classes,
            "metadata_fields": sorted(self.metadata_fields),
        }


def _single_input_name(feature_view: Mapping[str, Any] | None) -> str:
    """The name of a single numeric input, as the bundle's view read it at fit (``input`` for bundles
    that do not say): the name the view looks the input up by."""
    named = [v.get("name") for v in (feature_view or {}).get("inputs", []) if isinstance(v, Mapping)]
    return str(named[0]) if len(named) == 1 and isinstance(named[0], str) else "input"


def _load_bundle(bpath: Path, sha: str | None, model_bytes: bytes | None, mpath: Path | None) -> Bundle:
    """The bundle, checked against the model's sha256. A file that is no ONNX model at all also fails
    that check: then the model is named as the problem, not the bundle."""
    try:
        return Bundle.load(bpath, expected_model_sha256=sha) if sha else Bundle.load(bpath)
    except BundleError:
        problem = onnx_problem(model_bytes) if model_bytes is not None else None
        if problem is not None:
            raise ModelLoadError(f"model file {mpath} is not an ONNX model ({problem})") from None
        raise


@dataclass(frozen=True)
class _Loaded:
    """What :func:`_load_model_and_bundle` read: the bundle, the model's digest, the classifier (serve mode),
    the model's inputs and the bundle's feature view."""

    bundle: Bundle
    sha: str | None
    classifier: OnnxClassifier | None
    signature: Signature
    view: FeatureView


def _model_bytes(settings: AgentSettings, mpath: Path | None) -> tuple[bytes | None, str | None]:
    """The model file's bytes (serve mode: the model runs here) and its digest (any mode naming one)."""
    if settings.mode == "serve":
        if mpath is None:
            raise UserError("model.path is required in serve mode: set it in the config, or ICOS_AGENT_MODEL__PATH")
        model_bytes = read_model_file(mpath)
        return model_bytes, sha256_bytes(model_bytes)
    if mpath is not None:
        if not mpath.is_file():
            raise UserError(f"model.path: file not found: {mpath}")
        return None, _file_sha256(mpath)
    return None, None


def _load_model_and_bundle(settings: AgentSettings, mpath: Path | None, bpath: Path) -> _Loaded:
    """The model (serve mode) and the bundle checked against it; the model's own errors first: they name
    the file to fix. Raises the loaders' errors (:func:`load_runtime` names them)."""
    m = settings.model
    model_bytes, sha = _model_bytes(settings, mpath)
    if settings.mode != "observe":
        _refuse_table_bundle(bpath, settings.mode)
    bundle = _load_bundle(bpath, sha, model_bytes, mpath)
    signature = (
        Signature.from_list(bundle.inputs)
        if bundle.inputs
        else Signature.of_array(_single_input_name(bundle.feature_view), bundle.input_shape)
    )
    view = view_of_bundle(bundle.feature_view, bundle.feature_names, signature)
    classifier: OnnxClassifier | None = None
    if model_bytes is not None:  # built whole: the runtime never changes its classifier
        classifier = OnnxClassifier(
            model_bytes,
            path=str(mpath),
            name=m.name,
            scores_output=m.scores_output,
            scores_kind=m.scores_kind,
            classes=m.classes,
            max_batch=settings.server.max_batch,
            decision_threshold=bundle.decision_threshold,
            view=view,
        )
        signature = classifier.signature
    elif view.extra_outputs:
        raise UserError(
            f"bundle {bpath} reads the model's own representation ({view.embedding!r}), which mode "
            f"{settings.mode!r} cannot see (the model runs elsewhere): refit it with "
            "`icos-agent fit --features raw` (or pooled, hashed)"
        )
    return _Loaded(bundle, sha, classifier, signature, view)


def _classes(settings: AgentSettings, loaded: _Loaded) -> list[str]:
    """The class names: the model's (checked against the bundle's count), else the configured or the bundle's."""
    if loaded.classifier is None:
        return list(settings.model.classes) if settings.model.classes else list(loaded.bundle.classes)
    classes = loaded.classifier.classes
    if len(loaded.bundle.classes) != len(classes):
        raise UserError(
            f"bundle has {len(loaded.bundle.classes)} classes but the model has {len(classes)}: it was fitted for "
            "another model; refit it with `icos-agent fit --model` on this one"
        )
    return classes


def load_runtime(
    settings: AgentSettings,
    *,
    model_path: str | Path | None = None,
    bundle_path: str | Path | None = None,
    version: str | None = None,
) -> Runtime:
    """Load the model (serve mode) and the bundle; raises :class:`UserError` naming what is wrong."""
    m = settings.model
    mpath = Path(model_path) if model_path is not None else m.path
    bpath = Path(bundle_path) if bundle_path is not None else settings.bundle.path
    if bpath is None:
        raise UserError("bundle.path is not set: set it in the config, or ICOS_AGENT_BUNDLE__PATH")
    try:
        loaded = _load_model_and_bundle(settings, mpath, bpath)
    except ModelLoadError as exc:
        where = "" if model_path is not None else ": check model.path (in the config, or ICOS_AGENT_MODEL__PATH)"
        raise UserError(f"{exc}{where}") from exc
    except (BundleError, ViewError) as exc:
        raise UserError(str(exc)) from exc
    bundle, signature = loaded.bundle, loaded.signature
    if not bundle.estimator_calibration:
        raise UserError(f"bundle {bpath} has no estimator calibration; refit it with `icos-agent fit`")
    calibration = EstimatorCalibration.from_dict(bundle.estimator_calibration)
    single = signature.single
    input_shape = tuple(int(d) for d in single.shape if d is not None) if single is not None and single.fixed else ()
    classes = _classes(settings, loaded)
    idi = bundle.idi
    manifest = Path(bpath) / "manifest.json"
    metadata_only = idi is None or all(c.subject == "field" for r in idi.rules for c in r.conditions)
    # TDI + ADI compiled into one ONNX graph: same verdicts as bundle.oracle(), a fraction of the cost
    oracle = CompiledOracle(bundle.oracle(), loaded.view.width, len(classes))
    return Runtime(
        name=m.name,
        version=version or m.version,
        mode=settings.mode,
        classifier=loaded.classifier,
        input_name=single.name if single is not None and (loaded.classifier is not None or bundle.inputs) else None,
        input_shape=input_shape,
        classes=classes,
        bundle=bundle,
        oracle=oracle,
        oracle_no_metadata=oracle.without_idi() if metadata_only else oracle,
        calibration=calibration,
        metadata_fields=frozenset(idi.metadata_fields) if idi is not None else frozenset(),
        input_fields=frozenset(idi.input_fields) if idi is not None else frozenset(),
        model_sha256=loaded.sha or bundle.model_sha256 or "",
        bundle_digest=_file_sha256(manifest) if manifest.is_file() else (bundle.model_sha256 or ""),
        scores_kind=m.scores_kind,
        max_batch=settings.server.max_batch,
        max_elements=settings.server.max_tensor_elements,
        max_metadata_value_bytes=settings.server.max_metadata_value_bytes,
        model_path=str(mpath) if mpath else None,
        bundle_path=str(bpath),
        decision_threshold=bundle.decision_threshold,
        headline=headline_estimator(bundle.headline),
        signature=signature,
        view=loaded.view,
    )


def _refuse_table_bundle(bpath: Path, mode: str) -> None:
    """Serve and proxy modes judge a model's own answers; a bundle fitted from tables has no model."""
    try:
        table = Bundle.table_source(bpath)
    except BundleError:
        return  # the load below names the problem
    if table is not None:
        raise UserError(
            f"bundle {bpath} was fitted from a table of predictions (no model); mode {mode!r} needs a bundle "
            "fitted from the ONNX model: use mode 'observe' with this bundle, or refit it with `icos-agent fit --model`"
        )
