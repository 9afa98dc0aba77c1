"""The demo's terminal view: a table redrawn in place (ANSI) on a terminal, plain lines otherwise.

Rows are the truth, every estimator (the headline first, marked ``*``) with its 95 % interval, the
headline's error and the verdict mix; columns are the phases. Each column is read from the agent's
count window, which holds exactly the last ``N`` predictions (``N`` = one phase), so a finished
phase's column describes that phase alone.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import TextIO

from agent.demo.record import DemoRecord, PhaseStats, drop_line
from agent.results.served import ServedEstimate

LABEL_WIDTH = 18
VERDICT_ROWS = ("pass", "fail:idi", "fail:tdi", "fail:adi")


def _bound(x: float) -> str:
    return "1.00" if x >= 0.995 else f"{x:.2f}"[1:] if x >= 0 else f"{x:.2f}"


def estimate_cell(e: ServedEstimate | None, wide: bool) -> str:
    interval = None if e is None else e.interval()
    if interval is None:
        return "-"
    v, lo, hi = interval
    if wide:
        return f"{v:.3f} [{_bound(lo)},{_bound(hi)}]"
    return f"{v:.3f}±{(hi - lo) / 2:.3f}"[:11]


def table_lines(record: DemoRecord, width: int | None = None) -> list[str]:
    """The table as plain text lines (no escape codes)."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    wide = LABEL_WIDTH + len(record.phases) * 17 <= width
    col = 17 if wide else 12

    def row(label: str, cells: list[str]) -> str:
        return label[:LABEL_WIDTH].ljust(LABEL_WIDTH) + "".join(c[: col - 1].ljust(col) for c in cells)

    phases = record.phases
    started = [i <= record.current for i in range(len(phases))]

    def per_phase(fn: object) -> list[str]:
        assert callable(fn)
        return [fn(p) if s else "" for p, s in zip(phases, started, strict=True)]

    lines = [row("", [p.name for p in phases])]
    lines.append(row("sent", per_phase(lambda p: f"{p.sent}/{p.planned}" + ("" if p.done else " …"))))
    lines.append(row("truth", per_phase(lambda p: "-" if p.accuracy is None else f"{p.accuracy:.3f}")))
    if any(p.realized is not None for p in phases):
        lines.append(row("realized (labels)", per_phase(lambda p: "-" if p.realized is None else f"{p.realized:.3f}")))
    for name in record.estimators:
        label = f"{name} *" if name == record.headline else name
        lines.append(row(label, per_phase(lambda p, n=name: estimate_cell(p.estimates.get(n), wide))))
    if record.headline:

        def err(p: PhaseStats) -> str:
            e = p.estimates.get(record.headline)
            return "-" if not e or p.accuracy is None else f"{e.error(p.accuracy):.3f}"

        lines.append(row(f"|err| {record.headline}", per_phase(err)))
    seen = {v for p in phases for v in p.verdicts}
    for verdict in VERDICT_ROWS:
        if verdict in seen or verdict == "pass":
            lines.append(
                row(f"verdict {verdict}", per_phase(lambda p, v=verdict: f"{p.verdict_shares().get(v, 0.0):.1%}"))
            )
    return lines


def phase_line(record: DemoRecord, i: int) -> str:
    """One line summing up finished phase ``i``."""
    p = record.phases[i]
    parts = [f"[{i + 1}/{len(record.phases)}] {p.name}: {p.sent} predictions in {p.seconds:.1f} s"]
    if p.accuracy is not None:
        parts.append(f"truth {p.accuracy:.3f}")
    if p.realized is not None:
        parts.append(f"realized (labels) {p.realized:.3f}")
    for name in record.estimators:
        e = p.estimates.get(name)
        if e:
            mark = "*" if name == record.headline else ""
            caveat = " (unreliable)" if name in p.unreliable else ""
            parts.append(f"{name}{mark} {e.to_text()}{caveat}")
    mix = ", ".join(f"{k} {v:.1%}" for k, v in p.verdict_shares().items())
    parts.append(f"verdicts {mix}")
    return " | ".join(parts) + f"\n      where the drop is: {drop_line(p.drop)}"


class LiveView:
    """Shows the replay: ``live`` redraws the table in place; otherwise one line per finished phase."""

    def __init__(self, live: bool, out: TextIO | None = None, min_interval: float = 0.2) -> None:
        self.out = out or sys.stdout
        self.live = live
        self.min_interval = min_interval
        self._drawn = 0
        self._last = 0.0

    @staticmethod
    def wanted(no_live: bool, out: TextIO | None = None) -> bool:
        """Live redraws only on a real terminal (not ``--no-live``, not ``TERM=dumb``)."""
        stream = out or sys.stdout
        return not no_live and stream.isatty() and os.environ.get("TERM", "") != "dumb"

    def say(self, text: str) -> None:
        """A message above the table (the table is redrawn below it)."""
        self._erase()
        print(text, file=self.out, flush=True)
        self._drawn = 0

    def _erase(self) -> None:
        if self.live and self._drawn:
            self.out.write(f"\x1b[{self._drawn}F\x1b[J")

    def update(self, record: DemoRecord, force: bool = False) -> None:
        if not self.live:
            return
        now = time.monotonic()
        if not force and now - self._last < self.min_interval:
            return
        self._last = now
        lines = table_lines(record)
        self._erase()
        bold, dim, reset = "\x1b[1m", "\x1b[2m", "\x1b[0m"
        styled = [bold + lines[0] + reset]
        for line in lines[1:]:
            styled.append(bold + line + reset if line.startswith(f"{record.headline} *") else line)
        styled.append(dim + f"columns: the agent's count window ({record.window}) at the end of each phase" + reset)
        self.out.write("\n".join(styled) + "\n")
        self.out.flush()
        self._drawn = len(styled)

    def phase_done(self, record: DemoRecord, i: int) -> None:
        if self.live:
            self.update(record, force=True)
        else:
            print(phase_line(record, i), file=self.out, flush=True)

    def finish(self, record: DemoRecord) -> None:
        """Leave the final table on screen (plain mode prints it once)."""
        if self.live:
            self.update(record, force=True)
            self._drawn = 0
        else:
            print("", file=self.out)
            for line in table_lines(record, width=200):
                print(line.rstrip(), file=self.out)
            print(f"(columns: the agent's count window {record.window} at the end of each phase)", file=self.out)
        self.out.flush()
