"""What live inputs are compared with: a PCA of the training inputs and the TDI leaves.

The reference is fitted once per bundle; it turns each live input into its PCA reconstruction error
and gives the training share of every TDI leaf and the clean mean confidence of every class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from agent.estimation.layout import LEAF_BINS, PCA_QUANTILES, floored_scales

#: Samples per step of :meth:`InputReference.pca_error` (its float64 buffer stays in the CPU cache).
PCA_CHUNK = 64
#: Pseudo-count pulling a class's clean mean confidence toward the overall clean mean (rare classes).
CLASS_PRIOR_WEIGHT = 5.0
#: Features above which the leading components are found by a randomized SVD: the eigendecomposition of
#: the D×D scatter matrix is O(D³), minutes for a view of thousands of columns.
EXACT_PCA_MAX = 1024


def leading_components(z: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` leading principal directions of the (centred) rows ``z`` ``[N, D]``, as rows ``[k, D]``:
    the top eigenvectors of ``zᵀz`` for at most :data:`EXACT_PCA_MAX` columns, else a randomized SVD
    (Halko et al. 2011: seeded, with power iterations; the subspace of the leading components it finds
    differs from the exact one by far less than a window's sampling error)."""
    if z.shape[1] <= EXACT_PCA_MAX:
        # top-k eigenvectors of the D×D scatter matrix (cheaper than an SVD of the N×D data)
        _, vecs = np.linalg.eigh(z.T @ z)
        return np.asarray(vecs[:, ::-1][:, :k].T)
    from sklearn.utils.extmath import randomized_svd

    _, _, vt = randomized_svd(z, k, n_oversamples=10, n_iter=6, random_state=0)
    return np.asarray(vt[:k])


@dataclass(frozen=True)
class InputReference:
    """What live inputs are compared with (JSON-able): a PCA of the training inputs and the TDI leaves.

    ``center``/``scale``/``basis``: the PCA (``k`` components over standardised features; ``scale``
    has one entry for images, one per feature for tables); ``pca_edges``: bin edges of the
    reconstruction error; ``rule_label``/``rule_selected``: class and selection of every TDI leaf
    rule; ``leaf_ref``: the training data's share of every leaf; ``class_conf``: the mean top-class
    probability of the clean calibration split per predicted class (empty: no class features);
    ``leaf_bins``: how many bins of leaves windows count (:func:`leaf_bin_of_rule`; 0: one per leaf,
    references fitted before the leaves were binned).
    """

    center: tuple[float, ...]
    scale: tuple[float, ...]
    basis: tuple[tuple[float, ...], ...]
    pca_edges: tuple[float, ...]
    rule_label: tuple[int, ...]
    rule_selected: tuple[bool, ...]
    leaf_ref: tuple[float, ...]
    class_conf: tuple[float, ...] = ()
    leaf_bins: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "_center", np.asarray(self.center, dtype=np.float64))
        object.__setattr__(self, "_scale", np.asarray(self.scale, dtype=np.float64))
        object.__setattr__(self, "_basis", np.asarray(self.basis, dtype=np.float64).reshape(-1, len(self.center)))
        object.__setattr__(self, "_label", np.asarray(self.rule_label, dtype=np.int64))
        object.__setattr__(self, "_selected", np.asarray(self.rule_selected, dtype=bool))
        object.__setattr__(self, "_fast_pca", self._fast_pca_terms())
        bin_of = leaf_bin_of_rule(self.leaf_ref, self.leaf_bins)
        object.__setattr__(self, "leaf_bin", bin_of)
        object.__setattr__(
            self, "leaf_bin_ref", np.bincount(bin_of, weights=np.asarray(self.leaf_ref), minlength=self.n_leaf_bins)
        )

    @property
    def n_leaf_bins(self) -> int:
        """Length of a window's leaf counts (0 without TDI leaves)."""
        return (self.leaf_bins or self.n_rules) if self.n_rules else 0

    def _fast_pca_terms(self) -> tuple[np.ndarray, np.ndarray, float, float] | None:
        """For one global scale (images): ``(M, Bc, ‖c‖², s⁻²)`` with the float32 ``D×(k+1)`` matrix
        ``M = [Bᵀ/s | c/s²]``, so that one product ``f M`` gives both ``B z`` and ``f·c`` (see
        :meth:`pca_error`). None for per-feature scales (tables), where the direct form is kept:
        expanding ``‖(f − c)/s‖²`` would cancel badly for features far from zero with a small spread."""
        center, scale, basis = self._center, self._scale, self._basis  # type: ignore[attr-defined]
        if scale.size != 1 or not len(center):
            return None
        inv = 1.0 / float(scale[0])
        m = np.concatenate([basis.T * inv, (center * inv * inv)[:, None]], axis=1).astype(np.float32)
        bc = (center * inv) @ basis.T
        return np.ascontiguousarray(m), bc, float(((center * inv) ** 2).sum()), inv * inv

    @property
    def n_rules(self) -> int:
        return len(self.rule_label)

    @property
    def n_classes(self) -> int:
        return len(self.class_conf)

    def pca_error(self, features: np.ndarray) -> np.ndarray:
        """Root-mean-square PCA reconstruction error of every sample (standardised units), O(N·D·k).

        Computed in chunks of :data:`PCA_CHUNK` samples in one reused float64 buffer (the same
        operations in the same order as ``z = (f − center) / scale; r = z − (z Bᵀ) B``, without
        an N×D temporary per step)."""
        if len(features) == 0:
            return np.zeros(0)
        f = np.asarray(features).reshape(len(features), -1)
        n = len(f)
        fast = self._fast_pca  # type: ignore[attr-defined]
        if fast is not None and f.shape[1] == len(self.center):
            return self._pca_error_global_scale(f, *fast)
        center, scale = self._center, self._scale  # type: ignore[attr-defined]
        basis = self._basis  # type: ignore[attr-defined]
        out = np.empty(n, dtype=np.float64)
        buf = np.empty((min(PCA_CHUNK, n), f.shape[1]), dtype=np.float64)
        for a in range(0, n, PCA_CHUNK):
            z = buf[: min(PCA_CHUNK, n - a)]
            np.copyto(z, f[a : a + len(z)], casting="unsafe")
            np.subtract(z, center, out=z)
            np.divide(z, scale, out=z)
            z -= (z @ basis.T) @ basis
            np.multiply(z, z, out=z)
            out[a : a + len(z)] = z.mean(axis=1)
        return np.sqrt(out, out=out)

    @staticmethod
    def _pca_error_global_scale(f: np.ndarray, m: np.ndarray, bc: np.ndarray, cc: float, inv2: float) -> np.ndarray:
        """:meth:`pca_error` for one global scale ``s``, via ``‖z − Bᵀ B z‖² = ‖z‖² − ‖B z‖²`` (the rows
        of ``B`` are orthonormal) with ``z = (f − c)/s``: ``B z = f Bᵀ/s − B c/s`` and
        ``‖z‖² = ‖f‖²/s² − 2 f·c/s² + ‖c‖²/s²``. One float32 ``[N, D] × [D, k+1]`` product and one
        row norm, instead of the reconstruction ``[N, D]`` in float64 (3–5× less CPU on the request
        path; relative difference to the direct form about 1e-6)."""
        n, d = f.shape
        out = np.empty(n, dtype=np.float64)
        for a in range(0, n, 8 * PCA_CHUNK):
            g = np.asarray(f[a : a + 8 * PCA_CHUNK], dtype=np.float32)
            prod = (g @ m).astype(np.float64)
            proj = prod[:, :-1]
            proj -= bc
            zz = np.einsum("ij,ij->i", g, g).astype(np.float64) * inv2 - 2.0 * prod[:, -1] + cc
            zz -= np.einsum("ij,ij->i", proj, proj)
            out[a : a + len(g)] = np.maximum(zz, 0.0) / d
        return np.sqrt(out, out=out)

    def to_dict(self) -> dict[str, object]:
        return {
            "center": list(self.center),
            "scale": list(self.scale),
            "basis": [list(b) for b in self.basis],
            "pca_edges": list(self.pca_edges),
            "rule_label": list(self.rule_label),
            "rule_selected": list(self.rule_selected),
            "leaf_ref": list(self.leaf_ref),
            "class_conf": list(self.class_conf),
            "leaf_bins": self.leaf_bins,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> InputReference:
        return cls(
            center=tuple(float(v) for v in d["center"]),
            scale=tuple(float(v) for v in d["scale"]),
            basis=tuple(tuple(float(v) for v in row) for row in d["basis"]),
            pca_edges=tuple(float(v) for v in d["pca_edges"]),
            rule_label=tuple(int(v) for v in d["rule_label"]),
            rule_selected=tuple(bool(v) for v in d["rule_selected"]),
            leaf_ref=tuple(float(v) for v in d["leaf_ref"]),
            class_conf=tuple(float(v) for v in d.get("class_conf", ())),
            leaf_bins=int(d.get("leaf_bins", 0)),
        )

    @classmethod
    def fit(
        cls,
        train_features: np.ndarray,
        clean_features: np.ndarray,
        *,
        per_feature_scale: bool,
        rule_label: Sequence[int] = (),
        rule_selected: Sequence[bool] = (),
        train_rules: np.ndarray | None = None,
        components: int = 10,
        clean_labels: np.ndarray | None = None,
        clean_confidences: np.ndarray | None = None,
        n_classes: int = 0,
    ) -> InputReference:
        """PCA of the training inputs (images: one global scale, tables: per-feature standard deviations);
        error bins from the clean calibration inputs; leaf shares from the training inputs' TDI rules;
        per predicted class, the clean calibration inputs' mean top-class probability (``clean_labels``,
        ``clean_confidences``, ``n_classes``; smoothed toward the overall mean with
        :data:`CLASS_PRIOR_WEIGHT` pseudo-samples)."""
        tr = np.asarray(train_features, dtype=np.float64).reshape(len(train_features), -1)
        center = tr.mean(axis=0)
        if per_feature_scale:
            # a feature constant in training (a pixel always 0, a category never seen): one live sample
            # that moves it must not make an error of 1e9
            scale = floored_scales(tr.std(axis=0), 1e-9)
        else:
            scale = np.array([max(float(np.abs(tr).max()), 1e-9)])
        z = (tr - center) / scale
        k = int(min(components, z.shape[0], z.shape[1]))
        basis = leading_components(z, k)
        ref = cls(tuple(center), tuple(scale), tuple(tuple(r) for r in basis), (), (), (), ())
        n_rules = len(rule_label)
        if train_rules is not None and n_rules:
            counts = np.bincount(np.asarray(train_rules, dtype=np.int64), minlength=n_rules)[:n_rules]
            leaf_ref = counts / max(int(counts.sum()), 1)
        else:
            leaf_ref = np.zeros(n_rules)
        ref = replace(
            ref,
            rule_label=tuple(int(v) for v in rule_label),
            rule_selected=tuple(bool(v) for v in rule_selected),
            leaf_ref=tuple(float(v) for v in leaf_ref),
            leaf_bins=LEAF_BINS,
        )
        labels = clean_labels if n_classes > 0 else None
        return ref.with_clean(ref.pca_error(clean_features), labels, clean_confidences, n_classes)

    def with_clean(
        self,
        pca_errors: np.ndarray,
        clean_labels: np.ndarray | None,
        clean_confidences: np.ndarray | None,
        n_classes: int | None = None,
    ) -> InputReference:
        """The same reference with the statistics of another clean calibration split: the bins of its
        PCA errors ``pca_errors`` and, per predicted class, its mean top-class probability (smoothed
        toward its overall mean with :data:`CLASS_PRIOR_WEIGHT` pseudo-samples; ``n_classes`` defaults to
        this reference's, and no labels give no class statistics)."""
        errs = np.asarray(pca_errors, dtype=np.float64).reshape(-1)
        edges = tuple(float(v) for v in np.quantile(errs, PCA_QUANTILES)) if len(errs) else (0.0,) * len(PCA_QUANTILES)
        k = self.n_classes if n_classes is None else n_classes
        class_conf: tuple[float, ...] = ()
        if clean_labels is not None and clean_confidences is not None and k > 0 and len(clean_labels):
            lab = np.clip(np.asarray(clean_labels, dtype=np.int64).reshape(-1), 0, k - 1)
            conf = np.asarray(clean_confidences, dtype=np.float64).reshape(-1)
            counts = np.bincount(lab, minlength=k)[:k]
            sums = np.bincount(lab, weights=conf, minlength=k)[:k]
            w = CLASS_PRIOR_WEIGHT
            class_conf = tuple(float(v) for v in (sums + w * conf.mean()) / (counts + w))
        return replace(self, pca_edges=edges, class_conf=class_conf)


def leaf_bin_of_rule(leaf_ref: Sequence[float], bins: int) -> np.ndarray:
    """The bin of every TDI leaf: ``bins`` contiguous runs of leaves of about equal training share
    (a leaf goes to the bin its share's midpoint falls in); ``bins == 0`` keeps one bin per leaf."""
    share = np.asarray(leaf_ref, dtype=np.float64)
    if bins <= 0 or not len(share):
        return np.arange(len(share), dtype=np.int64)
    total = float(share.sum())
    if total <= 0:
        return (np.arange(len(share)) * bins // len(share)).astype(np.int64)
    mid = (np.cumsum(share) - share / 2) / total
    return np.minimum((mid * bins).astype(np.int64), bins - 1)
