"""The benchmark's tables and its targets, from the records of :mod:`bench.challenger.run`.

A (pair, scenario)'s direction is read from its mean true difference over the windows: ``better`` above
one point, ``worse`` below minus one point, else ``equal``. A wrong call is an interval that excludes 0 on
the side opposite to the window's own true difference (a true difference of exactly 0: any call is wrong).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from bench.challenger.run import DESIGNS, Record

#: Directions, and the true difference beyond which a (pair, scenario) is better or worse.
DIRECTIONS = ("better", "equal", "worse")
TOLERANCE = 0.01
#: The targets: label-free coverage and wrong calls in every direction, and the labeled width ratio.
MIN_COVERAGE = 0.90
MAX_WRONG_CALLS = 0.02
MAX_WIDTH_RATIO = 0.5


def direction(truth_mean: float) -> str:
    return "better" if truth_mean > TOLERANCE else "worse" if truth_mean < -TOLERANCE else "equal"


@dataclass(frozen=True)
class Rates:
    """Coverage, wrong-call rate, call rate and mean width of a group of records."""

    windows: int
    coverage: float
    wrong: float
    calls: float
    width: float

    @classmethod
    def of(cls, rs: Sequence[Record]) -> Rates:
        if not rs:
            return cls(0, float("nan"), float("nan"), float("nan"), float("nan"))
        return cls(
            len(rs),
            float(np.mean([r.covered for r in rs])),
            float(np.mean([r.wrong_call for r in rs])),
            float(np.mean([r.call for r in rs])),
            float(np.mean([r.upper - r.lower for r in rs])),
        )


@dataclass(frozen=True)
class Target:
    name: str
    value: float
    bound: str
    passed: bool

    def line(self) -> str:
        return f"| {self.name} | {self.value:.3f} | {self.bound} | {'PASS' if self.passed else 'FAIL'} |"


class Summary:
    """The records grouped by design, family and direction."""

    def __init__(self, records: Iterable[Record]) -> None:
        self.records = list(records)
        by: dict[tuple[str, str, str, str], list[Record]] = defaultdict(list)
        for r in self.records:
            by[(r.design, r.family, r.pair, r.scenario)].append(r)
        self.by = by
        truth = {k[1:]: float(np.mean([r.truth for r in v])) for k, v in by.items() if k[0] == "label_free"}
        self.direction = {k: direction(t) for k, t in truth.items()}
        self.truth = truth

    def group(self, design: str, family: str = "all", dirn: str = "all") -> list[Record]:
        out: list[Record] = []
        for (d, fam, pair, sc), rs in self.by.items():
            if d == design and family in ("all", fam) and dirn in ("all", self.direction[(fam, pair, sc)]):
                out += rs
        return out

    @property
    def families(self) -> list[str]:
        return sorted({r.family for r in self.records})

    def targets(self) -> list[Target]:
        out = []
        for dirn in DIRECTIONS:
            rates = Rates.of(self.group("label_free", dirn=dirn))
            if rates.windows:
                out.append(
                    Target(
                        f"label-free coverage, {dirn}",
                        rates.coverage,
                        f"≥ {MIN_COVERAGE}",
                        rates.coverage >= MIN_COVERAGE,
                    )
                )
                out.append(
                    Target(
                        f"label-free wrong calls, {dirn}",
                        rates.wrong,
                        f"≤ {MAX_WRONG_CALLS}",
                        rates.wrong <= MAX_WRONG_CALLS,
                    )
                )
        paired, unpaired = Rates.of(self.group("with_labels")), Rates.of(self.group("unpaired_with_labels"))
        ratio = paired.width / unpaired.width
        out.append(
            Target("width with labels, paired / unpaired", ratio, f"≤ {MAX_WIDTH_RATIO}", ratio <= MAX_WIDTH_RATIO)
        )
        return out

    def markdown(self, per_scenario: bool = False) -> str:
        """The targets, the designs by direction, the agent's design by family and direction, and (with
        ``per_scenario``) every (pair, scenario)."""
        lines = ["| target | measured | bound | |", "| --- | --- | --- | --- |"]
        lines += [t.line() for t in self.targets()]
        lines += ["", "| design | direction | windows | coverage | wrong calls | calls | mean width |"]
        lines.append("| --- | --- | --- | --- | --- | --- | --- |")
        for design in DESIGNS:
            for dirn in ("all", *DIRECTIONS):
                r = Rates.of(self.group(design, dirn=dirn))
                if r.windows:
                    rates = f"{r.coverage:.3f} | {r.wrong:.3f} | {r.calls:.3f} | {r.width:.4f}"
                    lines.append(f"| {design} | {dirn} | {r.windows} | {rates} |")
        lines += [
            "",
            "| family | direction | windows | coverage | wrong calls | calls | mean width | width with labels "
            "/ unpaired |",
        ]
        lines.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for fam in self.families:
            for dirn in DIRECTIONS:
                r = Rates.of(self.group("label_free", fam, dirn))
                if r.windows:
                    lab = Rates.of(self.group("with_labels", fam, dirn)).width
                    unp = Rates.of(self.group("unpaired_with_labels", fam, dirn)).width
                    lines.append(
                        f"| {fam} | {dirn} | {r.windows} | {r.coverage:.3f} | {r.wrong:.3f} | {r.calls:.3f} | "
                        f"{r.width:.4f} | {lab / unp:.2f} |"
                    )
        if per_scenario:
            lines += ["", self.scenario_table()]
        return "\n".join(lines)

    def scenario_table(self) -> str:
        lines = [
            "| pair | scenario | true Δ | disagree | coverage | wrong | calls | width | with labels | unpaired |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for (design, fam, pair, sc), rs in self.by.items():
            if design != "label_free":
                continue
            r = Rates.of(rs)
            lab = Rates.of(self.by[("with_labels", fam, pair, sc)]).width
            unp = Rates.of(self.by[("unpaired_with_labels", fam, pair, sc)]).width
            p = float(np.mean([x.p_dis for x in rs]))
            lines.append(
                f"| {fam} {pair} | {sc} | {self.truth[(fam, pair, sc)]:+.4f} | {p:.3f} | {r.coverage:.2f} | "
                f"{r.wrong:.2f} | {r.calls:.2f} | {r.width:.4f} | {lab:.4f} | {unp:.4f} |"
            )
        return "\n".join(lines)
