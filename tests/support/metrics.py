"""A Prometheus text exposition (``GET /metrics``), parsed once and read by name and labels.

``scrape(url).value("icos_invalid_requests_total", reason="too_large")`` sums the samples of that name
whose labels include the given ones (0 when none does); :meth:`Scrape.find` tells "absent" (None)
apart from 0; :meth:`Scrape.by_label` and :meth:`Scrape.by_labels` list a family's samples.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

LabelKey = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


class Scrape:
    """The samples of one exposition."""

    def __init__(self, samples: Iterable[Sample]) -> None:
        self.samples = list(samples)

    @classmethod
    def parse(cls, text: str) -> Scrape:
        return cls(
            Sample(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        )

    @classmethod
    def of_registry(cls, registry: CollectorRegistry) -> Scrape:
        """The samples of an in-process registry (``app.state.agent.registry``), without HTTP."""
        return cls(Sample(s.name, dict(s.labels), float(s.value)) for fam in registry.collect() for s in fam.samples)

    def matching(self, name: str, **labels: str) -> list[Sample]:
        want = labels.items()
        return [s for s in self.samples if s.name == name and want <= s.labels.items()]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels`` (0 when there is none)."""
        return sum(s.value for s in self.matching(name, **labels))

    def find(self, name: str, **labels: str) -> float | None:
        """Like :meth:`value`, but None when no sample matches."""
        found = self.matching(name, **labels)
        return sum(s.value for s in found) if found else None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """``{value of label: sample value}`` over the samples of ``name``."""
        return {s.labels[label]: s.value for s in self.samples if s.name == name and label in s.labels}

    def by_labels(self, name: str) -> dict[LabelKey, float]:
        """``{sorted label items: value}`` over the samples of ``name``."""
        return {tuple(sorted(s.labels.items())): s.value for s in self.samples if s.name == name}

    def flat(self) -> dict[str, float]:
        """Every sample as ``name`` (no labels) or ``name{k=v,...}`` (labels sorted) → value."""

        def key(s: Sample) -> str:
            return s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else "")

        return {key(s): s.value for s in self.samples}


def scrape(url: str, path: str = "/metrics", timeout: float = 10.0) -> Scrape:
    """``GET url + path``, parsed (``url`` is the server's base URL)."""
    r = httpx.get(url + path, timeout=timeout)
    r.raise_for_status()
    return Scrape.parse(r.text)


def metric(url: str, name: str, **labels: str) -> float:
    """One scrape's :meth:`Scrape.value` (summed over the matching samples)."""
    return scrape(url).value(name, **labels)
