"""The registry of labeling designs: every :class:`~agent.labels.draw_policy.DrawPolicy` by its
``labels.sampling`` value. Adding a design is one module with one policy class, its name among the values of
:data:`agent.config.sampling.Sampling` (the settings sit below the labels and cannot import them: the check
below keeps the two the same at import), its entry here, and the shared test every entry passes
(tests/unit/test_draw_policies.py)."""

from __future__ import annotations

from collections.abc import Mapping

from agent.config.sampling import SAMPLINGS, Sampling
from agent.config.settings import LabelsConfig
from agent.labels.active_draws import ActiveDraws
from agent.labels.draw_policy import DrawPolicy
from agent.labels.strata_draws import StratifiedDraws
from agent.labels.uniform_draws import UniformDraws

#: Every design by the ``labels.sampling`` value that chooses it.
DRAW_POLICIES: Mapping[Sampling, type[DrawPolicy]] = {p.name: p for p in (UniformDraws, ActiveDraws, StratifiedDraws)}

if sorted(DRAW_POLICIES) != sorted(SAMPLINGS):
    raise ImportError(f"labels.sampling allows {sorted(SAMPLINGS)}, the draw policies are {sorted(DRAW_POLICIES)}")


def draw_policy_of(config: LabelsConfig, start: float | None = None) -> DrawPolicy:
    """The policy ``labels.sampling`` chose (``start``: :meth:`DrawPolicy.of`)."""
    return DRAW_POLICIES[config.design].of(config, start)
