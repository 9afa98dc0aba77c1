"""What ``check`` runs beside its own report of a model (``check --challenger``: the challenger's comparison
with the model, :class:`agent.offline.paired_check.ChallengerCheck`), as a serving agent runs its companions
(:mod:`agent.judging.companions`): :func:`agent.offline.check.check_report` takes a list of them and adds
every one's sections to its report, never asking which kind it holds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from agent.estimation.statistics.window import WindowStats
from agent.model.classifier import Prediction
from agent.results.paired import PairedModel


@dataclass(frozen=True)
class CheckedBatch:
    """What every companion is given of the checked batch, in one object so that the check and each kind of
    companion do not each repeat the list: the data ``x`` (with ``metadata``) judged by ``judge``
    (:func:`agent.offline.check.judge`), the checked model's predictions, statistics and estimators
    (``champion``) and digest, the true classes ``y`` (None without), ``labels`` of them revealed with ``seed``."""

    judge: Any
    x: Any
    metadata: Mapping[str, np.ndarray] | None
    champion: tuple[Prediction, WindowStats, PairedModel]
    champion_sha256: str
    y: np.ndarray | None
    labels: int
    seed: int


class CheckCompanion(Protocol):
    """A part of a model check run beside it (see the module docstring)."""

    def sections(self, batch: CheckedBatch) -> Mapping[str, Any]:
        """Its top-level sections of the report on ``batch``."""
