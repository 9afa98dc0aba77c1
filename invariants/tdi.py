"""Training-data-dependent invariants (TDIs), ICOS paper §4.3, §5.4 and Table 4.

A decision tree is grown on the training inputs (flattened to [N, D]) against their true
labels, with the setting of Table 4: Gini index, no pruning, a minimum number of records per leaf.
Every leaf is a rule ``fail :- <path from the root>, output != <leaf class>`` with

* ``support`` — the number of training records in the leaf (an absolute count), and
* ``confidence`` — the share of those records that carry the leaf's majority class.

A rule is *selected* when ``confidence >= C`` and ``support > S`` (strict on support, as in
the public ICOS workflow; the defaults of C, S and the leaf size are those of
:class:`~invariants.fit_params.FitParams`). A sample violates the TDIs when its leaf
is selected and the model's label differs from the leaf class (§4.3: "the class assigned by
the CNN is different from the class corresponding to the first invariant ... which matches
the image"; the leaves of a tree partition the input space, so exactly one rule matches).

Evaluation never calls scikit-learn: the tree is stored as plain arrays and traversed with
numpy, with scikit-learn's exact semantics (inputs cast to float32, ``x <= threshold`` goes
left, NaN follows ``missing_go_to_left``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from invariants.fit_params import FitParams

__all__ = ["CRITERION", "TdiRule", "TrainingInvariants", "format_threshold"]

#: The tree's split criterion (Table 4: Gini index).
CRITERION = "gini"
_DEFAULT = FitParams()
_FORMAT = "icos-tdi"
_VERSION = 1


@dataclass(frozen=True)
class TdiRule:
    """One leaf of the tree read as an invariant (paper §5.4)."""

    leaf: int
    label: int
    support: int
    confidence: float
    selected: bool
    conditions: tuple[tuple[int, str, float], ...]
    text: str


def format_threshold(value: float) -> str:
    """A readable threshold: 6 significant digits, always with a decimal point (``253.0``)."""
    text = f"{value:.6g}"
    if text.lstrip("-").isdigit():
        text += ".0"
    return text


def _rule_text(
    conditions: Sequence[tuple[int, str, float]],
    label: int,
    feature_names: Sequence[str] | None,
    class_names: Sequence[str] | None,
) -> str:
    def feature(j: int) -> str:
        return feature_names[j] if feature_names is not None else f"x[{j}]"

    body = " & ".join(f"{feature(j)} {op} {format_threshold(t)}" for j, op, t in conditions)
    cls = class_names[label] if class_names is not None and 0 <= label < len(class_names) else str(label)
    return f"fail :- {body}, output != {cls}" if body else f"fail :- output != {cls}"


def _as_flat_float32(x: np.ndarray) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim == 0:
        raise ValueError("expected a batch of inputs, got a scalar")
    width = int(np.prod(arr.shape[1:], dtype=np.int64))
    return np.ascontiguousarray(arr.reshape(arr.shape[0], width), dtype=np.float32)


class TrainingInvariants:
    """The tree's leaves as TDIs, with a vectorised evaluator over the stored tree arrays.

    Build with :meth:`fit` (or :meth:`from_dict`); :meth:`reselect` changes C and S
    without refitting.
    """

    def __init__(
        self,
        *,
        children_left: np.ndarray,
        children_right: np.ndarray,
        feature: np.ndarray,
        threshold: np.ndarray,
        missing_go_to_left: np.ndarray,
        n_features: int,
        leaf_label: Mapping[int, int],
        leaf_support: Mapping[int, int],
        leaf_confidence: Mapping[int, float],
        leaf_selected: Mapping[int, bool] | None = None,
        confidence: float = _DEFAULT.confidence,
        support: int = _DEFAULT.support,
        min_samples_leaf: int = _DEFAULT.min_samples_leaf,
        seed: int = _DEFAULT.seed,
        feature_names: Sequence[str] | None = None,
        class_names: Sequence[str] | None = None,
    ) -> None:
        self.children_left = np.asarray(children_left, dtype=np.int64)
        self.children_right = np.asarray(children_right, dtype=np.int64)
        self.feature = np.asarray(feature, dtype=np.int64)
        self.threshold = np.asarray(threshold, dtype=np.float64)
        self.missing_go_to_left = np.asarray(missing_go_to_left, dtype=bool)
        self.n_features = int(n_features)
        self.confidence = float(confidence)
        self.support = int(support)
        self.min_samples_leaf = int(min_samples_leaf)
        self.seed = int(seed)
        self.feature_names: tuple[str, ...] | None = tuple(feature_names) if feature_names is not None else None
        self.class_names: tuple[str, ...] | None = tuple(class_names) if class_names is not None else None
        self._check_tree()
        if self.feature_names is not None and len(self.feature_names) != self.n_features:
            raise ValueError(f"{len(self.feature_names)} feature names for {self.n_features} features")

        leaves = np.flatnonzero(self.children_left == -1)
        missing = [int(leaf) for leaf in leaves if int(leaf) not in leaf_label]
        if missing:
            raise ValueError(f"no leaf table entry for leaf {missing[0]}")
        paths = self._paths()
        if len(paths) != leaves.shape[0]:
            raise ValueError("the tree has leaves that cannot be reached from the root")
        rules = []
        for leaf in leaves.tolist():
            support_count = int(leaf_support[leaf])
            conf = float(leaf_confidence[leaf])
            if leaf_selected is None:
                selected = conf >= self.confidence and support_count > self.support
            else:
                selected = bool(leaf_selected[leaf])
            conditions = paths[leaf]
            label = int(leaf_label[leaf])
            rules.append(
                TdiRule(
                    leaf=leaf,
                    label=label,
                    support=support_count,
                    confidence=conf,
                    selected=selected,
                    conditions=conditions,
                    text=_rule_text(conditions, label, self.feature_names, self.class_names),
                )
            )
        self.rules: list[TdiRule] = rules
        self._refresh_tables()

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def fit(
        cls,
        x: np.ndarray,
        y: np.ndarray,
        *,
        confidence: float = _DEFAULT.confidence,
        support: int = _DEFAULT.support,
        min_samples_leaf: int = _DEFAULT.min_samples_leaf,
        feature_names: Sequence[str] | None = None,
        class_names: Sequence[str] | None = None,
        seed: int = _DEFAULT.seed,
    ) -> TrainingInvariants:
        """Grow the tree of Table 4 (Gini, no pruning, ``min_samples_leaf`` records per leaf).

        ``x`` is any batch of training inputs (flattened to [N, D], cast to float32 as
        scikit-learn does), ``y`` the true class indices.
        """
        from sklearn.tree import DecisionTreeClassifier

        flat = _as_flat_float32(x)
        labels = np.asarray(y).reshape(-1)
        if flat.shape[0] != labels.shape[0]:
            raise ValueError(f"{flat.shape[0]} training inputs but {labels.shape[0]} labels")
        if flat.shape[0] == 0:
            raise ValueError("no training data")
        if not np.isfinite(flat).all():
            raise ValueError("training inputs contain NaN or infinite values")
        if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
            raise ValueError("training labels must be non-negative class indices")
        tree = DecisionTreeClassifier(criterion=CRITERION, min_samples_leaf=min_samples_leaf, random_state=seed)
        tree.fit(flat, labels)
        structure = tree.tree_
        leaf_of = structure.apply(flat)
        classes = np.asarray(tree.classes_, dtype=np.int64)
        # exact counts per (leaf, class): tree_.value holds fractions since scikit-learn 1.4
        class_pos = np.searchsorted(classes, labels)
        counts = np.zeros((structure.node_count, classes.shape[0]), dtype=np.int64)
        np.add.at(counts, (leaf_of, class_pos), 1)
        leaf_label, leaf_support, leaf_confidence = {}, {}, {}
        for leaf in np.flatnonzero(structure.children_left == -1).tolist():
            row = counts[leaf]
            total = int(row.sum())
            best = int(np.argmax(row))  # first maximum, as scikit-learn's predict
            leaf_label[leaf] = int(classes[best])
            leaf_support[leaf] = total
            leaf_confidence[leaf] = float(row[best]) / total
        return cls(
            children_left=structure.children_left,
            children_right=structure.children_right,
            feature=structure.feature,
            threshold=structure.threshold,
            missing_go_to_left=structure.missing_go_to_left,
            n_features=flat.shape[1],
            leaf_label=leaf_label,
            leaf_support=leaf_support,
            leaf_confidence=leaf_confidence,
            confidence=confidence,
            support=support,
            min_samples_leaf=min_samples_leaf,
            seed=seed,
            feature_names=feature_names,
            class_names=class_names,
        )

    def reselect(self, confidence: float, support: int) -> TrainingInvariants:
        """The same tree with another selection (``confidence >= C and support > S``); no refit."""
        clone = object.__new__(TrainingInvariants)
        clone.__dict__.update(self.__dict__)
        clone.confidence = float(confidence)
        clone.support = int(support)
        clone.rules = [
            replace(r, selected=r.confidence >= clone.confidence and r.support > clone.support) for r in self.rules
        ]
        clone._refresh_tables()
        return clone

    # -- introspection ------------------------------------------------------------------------

    @property
    def selected_rules(self) -> list[TdiRule]:
        return [r for r in self.rules if r.selected]

    @property
    def node_count(self) -> int:
        return int(self.children_left.shape[0])

    @property
    def rule_of_node(self) -> np.ndarray:
        """Index into :attr:`rules` for every node id (-1 for internal nodes), int32 [node_count]."""
        return self._rule_of_node

    @property
    def depth(self) -> int:
        return max((len(r.conditions) for r in self.rules), default=0)

    def __repr__(self) -> str:
        return (
            f"TrainingInvariants({len(self.rules)} leaves, {len(self.selected_rules)} selected at "
            f"C={self.confidence}, S={self.support})"
        )

    # -- evaluation ---------------------------------------------------------------------------

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """Leaf node id of every sample (int32 [N]); identical to scikit-learn's ``tree_.apply``.

        Vectorised: one numpy step per tree level over the samples still at internal nodes.
        """
        flat = self._check_input(x)
        n = flat.shape[0]
        node = np.zeros(n, dtype=np.int64)
        active = np.arange(n)
        left, right = self.children_left, self.children_right
        while active.size:
            current = node[active]
            internal = left[current] != -1
            if not internal.all():
                active, current = active[internal], current[internal]
                if not active.size:
                    break
            values = flat[active, self.feature[current]]
            go_left = values.astype(np.float64) <= self.threshold[current]
            nan = np.isnan(values)
            if nan.any():
                go_left = np.where(nan, self.missing_go_to_left[current], go_left)
            node[active] = np.where(go_left, left[current], right[current])
        return node.astype(np.int32)

    def rule_index(self, x: np.ndarray) -> np.ndarray:
        """Index into :attr:`rules` of the leaf each sample falls in (int32 [N])."""
        return self._rule_of_node[self.leaves(x)]

    def evaluate(self, x: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """Index into :attr:`rules` of the violated rule per sample, or -1 (int32 [N]).

        A sample violates its leaf's rule when the rule is selected and ``labels`` (the
        model's predictions) differ from the rule's class.
        """
        labels = np.asarray(labels).reshape(-1)
        rule = self.rule_index(x)
        if rule.shape[0] != labels.shape[0]:
            raise ValueError(f"{rule.shape[0]} inputs but {labels.shape[0]} labels")
        violated = self._selected[rule] & (labels != self._label[rule])
        return np.where(violated, rule, -1).astype(np.int32)

    def coverage(self, x: np.ndarray) -> float:
        """Share of samples whose leaf holds a selected rule (0.0 for an empty batch)."""
        rule = self.rule_index(x)
        return float(self._selected[rule].mean()) if rule.size else 0.0

    # -- serialisation ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form: tree arrays, leaf table and fit parameters."""
        return {
            "format": _FORMAT,
            "format_version": _VERSION,
            "params": {
                "criterion": CRITERION,
                "confidence": self.confidence,
                "support": self.support,
                "min_samples_leaf": self.min_samples_leaf,
                "seed": self.seed,
            },
            "n_features": self.n_features,
            "feature_names": list(self.feature_names) if self.feature_names is not None else None,
            "class_names": list(self.class_names) if self.class_names is not None else None,
            "tree": {
                "children_left": self.children_left.tolist(),
                "children_right": self.children_right.tolist(),
                "feature": self.feature.tolist(),
                "threshold": self.threshold.tolist(),
                "missing_go_to_left": self.missing_go_to_left.astype(int).tolist(),
            },
            "leaves": [
                {
                    "leaf": r.leaf,
                    "class": r.label,
                    "support": r.support,
                    "confidence": r.confidence,
                    "selected": r.selected,
                    "text": r.text,
                }
                for r in self.rules
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainingInvariants:
        """Inverse of :meth:`to_dict`; raises ``ValueError`` naming the bad entry."""
        if not isinstance(data, Mapping):
            raise ValueError("TDI data must be a JSON object")
        if data.get("format") != _FORMAT or data.get("format_version") != _VERSION:
            raise ValueError(
                f"unsupported TDI format {data.get('format')!r} version {data.get('format_version')!r} "
                f"(expected {_FORMAT!r} version {_VERSION})"
            )
        try:
            params, tree, leaves = data["params"], data["tree"], data["leaves"]
            arrays = {
                k: np.asarray(tree[k])
                for k in ("children_left", "children_right", "feature", "threshold", "missing_go_to_left")
            }
            for k, arr in arrays.items():
                if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iuf"):
                    raise ValueError(f"tree.{k} must be a list of numbers")
            table = {int(e["leaf"]): e for e in leaves}
            if len(table) != len(leaves):
                raise ValueError("duplicate leaf ids in the leaf table")
            for e in leaves:
                if not isinstance(e["selected"], bool):
                    raise ValueError(f"leaf {e['leaf']}: 'selected' must be true or false")
                conf = float(e["confidence"])
                if not (0.0 <= conf <= 1.0) or math.isnan(conf):
                    raise ValueError(f"leaf {e['leaf']}: confidence {conf} outside [0, 1]")
            return cls(
                children_left=arrays["children_left"],
                children_right=arrays["children_right"],
                feature=arrays["feature"],
                threshold=arrays["threshold"],
                missing_go_to_left=arrays["missing_go_to_left"],
                n_features=int(data["n_features"]),
                leaf_label={k: int(e["class"]) for k, e in table.items()},
                leaf_support={k: int(e["support"]) for k, e in table.items()},
                leaf_confidence={k: float(e["confidence"]) for k, e in table.items()},
                leaf_selected={k: e["selected"] for k, e in table.items()},
                confidence=float(params["confidence"]),
                support=int(params["support"]),
                min_samples_leaf=int(params.get("min_samples_leaf", _DEFAULT.min_samples_leaf)),
                seed=int(params.get("seed", _DEFAULT.seed)),
                feature_names=data.get("feature_names"),
                class_names=data.get("class_names"),
            )
        except KeyError as exc:
            raise ValueError(f"missing key {exc.args[0]!r}") from exc
        except (TypeError, AttributeError) as exc:
            raise ValueError(f"malformed TDI data ({exc})") from exc

    # -- internals ----------------------------------------------------------------------------

    def _check_tree(self) -> None:
        n = self.children_left.shape[0]
        arrays = (self.children_right, self.feature, self.threshold, self.missing_go_to_left)
        if n == 0 or any(a.shape != (n,) for a in arrays):
            raise ValueError("tree arrays must be non-empty and of equal length")
        leaf = self.children_left == -1
        if not np.array_equal(leaf, self.children_right == -1):
            raise ValueError("a node has exactly one child")
        ids = np.arange(n)
        internal = ~leaf
        # scikit-learn numbers children after their parent; this also rules out cycles
        if (self.children_left[internal] <= ids[internal]).any() or (self.children_left[internal] >= n).any():
            raise ValueError("tree.children_left holds an invalid node id")
        if (self.children_right[internal] <= ids[internal]).any() or (self.children_right[internal] >= n).any():
            raise ValueError("tree.children_right holds an invalid node id")
        feats = self.feature[internal]
        if (feats < 0).any() or (feats >= self.n_features).any():
            raise ValueError("tree.feature holds an index outside the input")
        if not np.isfinite(self.threshold[internal]).all():
            raise ValueError("tree.threshold holds a non-finite value")

    def _paths(self) -> dict[int, tuple[tuple[int, str, float], ...]]:
        paths: dict[int, tuple[tuple[int, str, float], ...]] = {}
        stack: list[tuple[int, tuple[tuple[int, str, float], ...]]] = [(0, ())]
        while stack:
            node, path = stack.pop()
            left, right = int(self.children_left[node]), int(self.children_right[node])
            if left == -1:
                paths[node] = path
                continue
            j, t = int(self.feature[node]), float(self.threshold[node])
            stack.append((right, (*path, (j, ">", t))))
            stack.append((left, (*path, (j, "<=", t))))
        return paths

    def _refresh_tables(self) -> None:
        self._rule_of_node = np.full(self.node_count, -1, dtype=np.int32)
        for i, r in enumerate(self.rules):
            self._rule_of_node[r.leaf] = i
        self._selected = np.array([r.selected for r in self.rules], dtype=bool)
        self._label = np.array([r.label for r in self.rules], dtype=np.int64)

    def _check_input(self, x: np.ndarray) -> np.ndarray:
        flat = _as_flat_float32(x)
        if flat.shape[1] != self.n_features:
            raise ValueError(f"inputs have {flat.shape[1]} features, the invariants expect {self.n_features}")
        return flat
