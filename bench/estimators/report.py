"""Tables, targets and the generated part of ``docs/estimation.md`` (plus its plot)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.estimation.estimators.registry import ESTIMATORS, RECOMMENDED_ESTIMATOR
from bench.estimators.harness import HELD_OUT, Record, seed_of, size_of
from bench.generated_docs import commit_of

ROOT = Path(__file__).resolve().parents[2]

BEGIN = "<!-- BEGIN GENERATED: python -m bench.estimators -->"
END = "<!-- END GENERATED -->"
BASELINES = ("icos", "icos_corrected", "avg_conf", "cbpe", "atc", "doc")


@dataclass(frozen=True)
class Cell:
    mae: float
    worst: float
    coverage: float
    n: int


def summarise(records: Sequence[Record]) -> dict[tuple[str, str, str, str], Cell]:
    """(model, idi, scenario, estimator) → MAE, worst absolute error, interval coverage."""
    groups: dict[tuple[str, str, str, str], list[Record]] = defaultdict(list)
    for r in records:
        groups[(r.model, r.idi, r.scenario, r.estimator)].append(r)
    out = {}
    for key, rs in groups.items():
        err = np.array([r.error for r in rs])
        out[key] = Cell(float(err.mean()), float(err.max()), float(np.mean([r.covered for r in rs])), len(rs))
    return out


def _ordered(records: Sequence[Record], attr: str) -> list[str]:
    return list(dict.fromkeys(getattr(r, attr) for r in records))


@dataclass(frozen=True)
class Overall:
    mean_mae: float
    worst_scenario_mae: float
    worst_error: float
    coverage: float
    in_distribution_mae: float


def overall(cells: dict[tuple[str, str, str, str], Cell], model: str, idi: str, estimator: str) -> Overall | None:
    mine = {k[2]: c for k, c in cells.items() if k[0] == model and k[1] == idi and k[3] == estimator}
    if not mine:
        return None
    maes = [c.mae for c in mine.values()]
    cov = float(np.average([c.coverage for c in mine.values()], weights=[c.n for c in mine.values()]))
    ind = mine["in_distribution"].mae if "in_distribution" in mine else float("nan")
    return Overall(float(np.mean(maes)), float(np.max(maes)), max(c.worst for c in mine.values()), cov, ind)


@dataclass(frozen=True)
class Target:
    text: str
    value: str
    ok: bool


#: The flag's targets: among windows whose flag is down, the headline within ``DOWN_WITHIN`` of the truth in at
#: least ``DOWN_SHARE``; silent misses (the headline off by more than ``MISS_BEYOND`` with the flag down) in at
#: most ``SILENT_MISSES`` of all windows; among windows whose headline is within ``RIGHT_WITHIN``, the flag
#: raised on at most ``RIGHT_FLAGGED``; among in-distribution windows, on at most ``IN_DISTRIBUTION_FLAGGED``.
DOWN_WITHIN, DOWN_SHARE = 0.05, 0.95
MISS_BEYOND, SILENT_MISSES = 0.10, 0.02
RIGHT_WITHIN, RIGHT_FLAGGED = 0.03, 0.25
IN_DISTRIBUTION_FLAGGED = 0.05


@dataclass(frozen=True)
class FlagRates:
    """The flag on ``estimator``'s windows of one model: the share of flag-down windows within 0.05 of the
    truth, of windows within 0.03 that are flagged, of in-distribution windows flagged, of windows off by more
    than 0.10 flagged, and how many windows each share is of; the share of all windows off by more than 0.10
    with the flag down (silent misses), of ``n_all``."""

    down_within: float
    n_down: int
    right_flagged: float
    n_right: int
    in_distribution: float
    n_in_distribution: int
    bad_flagged: float
    n_bad: int
    silent: float
    n_all: int


def flag_rates(records: Sequence[Record], model: str, estimator: str) -> FlagRates | None:
    """The flag's figures for ``estimator``'s label-free records of ``model`` (None: no record carries it)."""
    mine = [r for r in records if r.model == model and r.idi == "none" and r.estimator == estimator]
    mine = [r for r in mine if r.flag_raised is not None]
    if not mine:
        return None
    down = [r for r in mine if not r.flag_raised]
    right = [r for r in mine if r.error <= RIGHT_WITHIN]
    ind = [r for r in mine if r.scenario == "in_distribution"]
    bad = [r for r in mine if r.error > MISS_BEYOND]
    flagged = lambda rs: float(np.mean([bool(r.flag_raised) for r in rs])) if rs else float("nan")  # noqa: E731
    within = float(np.mean([r.error <= DOWN_WITHIN for r in down])) if down else float("nan")
    silent = float(np.mean([r.error > MISS_BEYOND and not r.flag_raised for r in mine]))
    return FlagRates(
        within, len(down), flagged(right), len(right), flagged(ind), len(ind), flagged(bad), len(bad), silent, len(mine)
    )


def flag_targets(records: Sequence[Record], model: str, estimator: str) -> list[Target]:
    """The four silent-miss targets of the flag on ``estimator``'s windows of ``model``."""
    f = flag_rates(records, model, estimator)
    if f is None:
        return []
    return [
        Target(
            f"flag down: headline within {DOWN_WITHIN} in ≥ {DOWN_SHARE:.0%}",
            f"{f.down_within:.1%} of {f.n_down} (flagged: {f.bad_flagged:.0%} of the {f.n_bad} off by > 0.10)",
            f.n_down == 0 or f.down_within >= DOWN_SHARE,
        ),
        Target(
            f"off by > {MISS_BEYOND:.2f} with the flag down: ≤ {SILENT_MISSES:.0%} of windows",
            f"{f.silent:.1%} of {f.n_all}",
            f.silent <= SILENT_MISSES,
        ),
        Target(
            f"headline within {RIGHT_WITHIN}: flagged on ≤ {RIGHT_FLAGGED:.0%}",
            f"{f.right_flagged:.1%} of {f.n_right}",
            f.n_right == 0 or f.right_flagged <= RIGHT_FLAGGED,
        ),
        Target(
            f"in distribution: flagged on ≤ {IN_DISTRIBUTION_FLAGGED:.0%}",
            f"{f.in_distribution:.1%} of {f.n_in_distribution}",
            f.n_in_distribution == 0 or f.in_distribution <= IN_DISTRIBUTION_FLAGGED,
        ),
    ]


def _scenario_maes(cells: dict[tuple[str, str, str, str], Cell], model: str, estimator: str) -> dict[str, float]:
    return {k[2]: c.mae for k, c in cells.items() if k[0] == model and k[1] == "none" and k[3] == estimator}


def targets(
    cells: dict[tuple[str, str, str, str], Cell], records: Sequence[Record], model: str, estimator: str
) -> list[Target]:
    """The targets of ``estimator`` (the headline, or it calibrated without each scenario's kind),
    label-free, against the confidence baselines of the same run: images (MNIST, digits) mean MAE ≤
    0.03, worst-scenario MAE ≤ 0.12, no scenario worse than ``avg_conf`` by more than 0.02, coverage
    ≥ 95%; tables no worse than ``cbpe`` in mean and worst-scenario MAE; and the flag's silent-miss targets
    (:func:`flag_targets`)."""
    rec = overall(cells, model, "none", estimator)
    avg, cbpe = overall(cells, model, "none", "avg_conf"), overall(cells, model, "none", "cbpe")
    if rec is None or avg is None:
        return []
    out: list[Target] = []
    if model == "tabular":
        ref = cbpe or avg
        out += [
            Target("mean MAE ≤ cbpe's", f"{rec.mean_mae:.4f} vs {ref.mean_mae:.4f}", rec.mean_mae <= ref.mean_mae),
            Target(
                "worst-scenario MAE ≤ cbpe's",
                f"{rec.worst_scenario_mae:.4f} vs {ref.worst_scenario_mae:.4f}",
                rec.worst_scenario_mae <= ref.worst_scenario_mae,
            ),
            Target(
                "in distribution ≤ cbpe's",
                f"{rec.in_distribution_mae:.4f} vs {ref.in_distribution_mae:.4f}",
                rec.in_distribution_mae <= ref.in_distribution_mae,
            ),
        ]
    else:
        mine, base = _scenario_maes(cells, model, estimator), _scenario_maes(cells, model, "avg_conf")
        gap = {sc: mine[sc] - base[sc] for sc in mine if sc in base}
        worst_sc = max(gap, key=lambda sc: gap[sc]) if gap else "–"
        out += [
            Target("mean MAE ≤ 0.03", f"{rec.mean_mae:.4f} (avg_conf {avg.mean_mae:.4f})", rec.mean_mae <= 0.03),
            Target(
                "worst-scenario MAE ≤ 0.12",
                f"{rec.worst_scenario_mae:.4f} (avg_conf {avg.worst_scenario_mae:.4f})",
                rec.worst_scenario_mae <= 0.12,
            ),
            Target(
                "no scenario worse than avg_conf by > 0.02",
                f"largest gap {gap.get(worst_sc, float('nan')):+.4f} ({worst_sc})",
                max(gap.values(), default=0.0) <= 0.02,
            ),
            Target("interval coverage ≥ 95%", f"{rec.coverage:.1%}", rec.coverage >= 0.95),
        ]
    return out + flag_targets(records, model, estimator)


def all_targets(cells: dict[tuple[str, str, str, str], Cell], records: Sequence[Record]) -> list[tuple[str, Target]]:
    """Every model's targets, for the headline as shipped and calibrated without each scenario's kind."""
    out = []
    for model in _ordered(records, "model"):
        for est, label in ((RECOMMENDED_ESTIMATOR, "shipped"), (HELD_OUT, "kind held out")):
            out += [(f"{model} ({label})", t) for t in targets(cells, records, model, est)]
    return out


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def scenario_table(records: Sequence[Record], cells: dict[tuple[str, str, str, str], Cell], model: str) -> list[str]:
    ests = [e for e in ESTIMATORS if any(k[3] == e for k in cells)]
    rows = []
    for sc in _ordered([r for r in records if r.model == model], "scenario"):
        row = [sc]
        for e in ests:
            c = cells.get((model, "none", sc, e))
            row.append(f"{c.mae:.3f} / {c.worst:.3f}" if c else "–")
        rows.append(row)
    for label, attr in (
        ("**mean MAE**", "mean_mae"),
        ("**worst-scenario MAE**", "worst_scenario_mae"),
        ("**worst error**", "worst_error"),
        ("**interval coverage**", "coverage"),
    ):
        row = [label]
        for e in ests:
            o = overall(cells, model, "none", e)
            v = getattr(o, attr) if o else float("nan")
            row.append(f"{v:.1%}" if attr == "coverage" else f"{v:.3f}")
        rows.append(row)
    header = ["scenario (MAE / worst)"] + [f"**{e}**" if e == RECOMMENDED_ESTIMATOR else e for e in ests]
    return _md_table(header, rows)


def idi_table(cells: dict[tuple[str, str, str, str], Cell], models: Sequence[str]) -> list[str]:
    ests = [e for e in ESTIMATORS if any(k[3] == e for k in cells)]
    rows = []
    for model in models:
        idis = [i for i in dict.fromkeys(k[1] for k in cells if k[0] == model) if i != "none"]
        for idi in idis:
            row = [model, idi]
            for e in ests:
                o = overall(cells, model, idi, e)
                row.append(f"{o.mean_mae:.3f} / {o.worst_scenario_mae:.3f}" if o else "–")
            rows.append(row)
    return _md_table(["model", "IDI partitioning", *ests], rows)


def held_out_table(records: Sequence[Record], cells: dict[tuple[str, str, str, str], Cell]) -> list[str]:
    """Per model and scenario with a kin in the calibration: ``shift_aware`` as shipped and
    calibrated without the scenario's kind of shift; then mean over all scenarios / worst scenario."""
    rows = []
    for model in _ordered(records, "model"):
        for sc in _ordered([r for r in records if r.model == model], "scenario"):
            a = cells.get((model, "none", sc, RECOMMENDED_ESTIMATOR))
            h = cells.get((model, "none", sc, HELD_OUT))
            if a is not None and h is not None and (a.mae, a.worst) != (h.mae, h.worst):
                rows.append([model, sc, f"{a.mae:.3f} / {a.worst:.3f}", f"{h.mae:.3f} / {h.worst:.3f}"])
        a_all, h_all = overall(cells, model, "none", RECOMMENDED_ESTIMATOR), overall(cells, model, "none", HELD_OUT)
        if a_all is not None and h_all is not None:
            rows.append(
                [
                    f"**{model}**",
                    "**all scenarios: mean MAE / worst-scenario MAE**",
                    f"{a_all.mean_mae:.3f} / {a_all.worst_scenario_mae:.3f}",
                    f"{h_all.mean_mae:.3f} / {h_all.worst_scenario_mae:.3f}",
                ]
            )
    if not rows:
        return []
    return _md_table(["model", "scenario", RECOMMENDED_ESTIMATOR, "its kind held out of calibration"], rows)


def _worst_scenario(cells: dict[tuple[str, str, str, str], Cell], model: str, estimator: str) -> str:
    mine = {k[2]: c.mae for k, c in cells.items() if k[0] == model and k[1] == "none" and k[3] == estimator}
    return max(mine, key=lambda sc: mine[sc]) if mine else "–"


def _variants(
    cells: dict[tuple[str, str, str, str], Cell], model: str, parse: Callable[[str], int | None], shipped: int
) -> dict[str, int]:
    """``shift_aware`` (as ``shipped``) and its pseudo-estimators in ``cells`` for ``model``, each with the
    number ``parse`` reads from its name (a calibration seed or a window size)."""
    names = {RECOMMENDED_ESTIMATOR: shipped}
    for k in cells:
        v = parse(k[3])
        if k[0] == model and v is not None:
            names[k[3]] = v
    return names


def seed_rows(
    cells: dict[tuple[str, str, str, str], Cell], model: str, shipped_seed: int
) -> list[tuple[int, Overall, str]]:
    """(seed, label-free overall figures, worst scenario) of ``shift_aware`` for every calibration
    seed in ``cells``: the shipped one first, then the others in increasing order."""
    names = _variants(cells, model, seed_of, shipped_seed)
    rows = []
    for name, s in sorted(names.items(), key=lambda kv: (kv[0] != RECOMMENDED_ESTIMATOR, kv[1])):
        o = overall(cells, model, "none", name)
        if o is not None:
            rows.append((s, o, _worst_scenario(cells, model, name)))
    return rows


def seed_table(records: Sequence[Record], cells: dict[tuple[str, str, str, str], Cell], shipped_seed: int) -> list[str]:
    """Per model: ``shift_aware``'s label-free figures for each calibration seed, then their range."""
    rows = []
    for model in _ordered(records, "model"):
        sr = seed_rows(cells, model, shipped_seed)
        if len(sr) < 2:
            continue
        for s, o, worst in sr:
            tag = f"{s} (shipped)" if s == shipped_seed else str(s)
            rows.append([model, tag, f"{o.mean_mae:.3f}", f"{o.worst_scenario_mae:.3f} ({worst})", f"{o.coverage:.1%}"])
        means = [o.mean_mae for _, o, _ in sr]
        worsts = [o.worst_scenario_mae for _, o, _ in sr]
        covs = [o.coverage for _, o, _ in sr]
        rows.append(
            [
                f"**{model}**",
                f"**range over {len(sr)} draws**",
                f"{min(means):.3f} – {max(means):.3f}",
                f"{min(worsts):.3f} – {max(worsts):.3f}",
                f"{min(covs):.1%} – {max(covs):.1%}",
            ]
        )
    if not rows:
        return []
    return _md_table(["model", "calibration seed", "mean MAE", "worst-scenario MAE", "interval coverage"], rows)


def size_rows(
    records: Sequence[Record], cells: dict[tuple[str, str, str, str], Cell], model: str, main_size: int
) -> list[tuple[int, Overall, float]]:
    """(window size, label-free overall figures, mean interval half-width) of ``shift_aware`` for
    every window size in ``records`` (``main_size`` is the one of the other tables), smallest first."""
    names = _variants(cells, model, size_of, main_size)
    half: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r.model == model and r.idi == "none" and r.estimator in names:
            half[r.estimator].append((r.upper - r.lower) / 2)
    rows = []
    for name, n in sorted(names.items(), key=lambda kv: kv[1]):
        o = overall(cells, model, "none", name)
        if o is not None:
            rows.append((n, o, float(np.mean(half[name]))))
    return rows


def size_table(records: Sequence[Record], cells: dict[tuple[str, str, str, str], Cell], main_size: int) -> list[str]:
    """Per model: ``shift_aware``'s label-free figures for each window size."""
    rows = []
    for model in _ordered(records, "model"):
        sr = size_rows(records, cells, model, main_size)
        if len(sr) < 2:
            continue
        for n, o, h in sr:
            tag = f"{n} (the tables above)" if n == main_size else str(n)
            rows.append(
                [model, tag, f"{o.mean_mae:.3f}", f"{o.worst_scenario_mae:.3f}", f"{o.coverage:.1%}", f"±{h:.3f}"]
            )
    if not rows:
        return []
    header = ["model", "predictions per window", "mean MAE", "worst-scenario MAE", "interval coverage", "mean interval"]
    return _md_table(header, rows)


def _section(title: str, text: str, table: list[str]) -> list[str]:
    """A generated subsection: its title, a paragraph and its table (nothing without a table)."""
    return [f"### {title}", "", text, "", *table, ""] if table else []


def markdown(records: Sequence[Record], meta: dict[str, str], plot_name: str | None) -> str:
    cells = summarise(records)
    models = _ordered(records, "model")
    lines = [
        f"Generated by `{meta['command']}` at commit {commit_of(ROOT)} ({meta['settings']}). Do not edit by hand.",
        "",
        "Cells are *MAE / worst absolute error* over the repetitions; the summary rows are the mean over "
        "scenarios of the MAE, the largest scenario MAE, the largest single error, and the share of "
        "repetitions whose 95% interval contains the true accuracy.",
        "",
    ]
    tg = all_targets(cells, records)
    if tg:
        lines += ["### Targets (recommended estimator, label-free, against the baselines of this run)", ""]
        lines += _md_table(
            ["model (calibration)", "target", "measured", "status"],
            [[m, t.text, t.value, "PASS" if t.ok else "FAIL"] for m, t in tg],
        )
        lines.append("")
    lines += _section(
        "Shifts of a kind held out of calibration",
        f"`{RECOMMENDED_ESTIMATOR}` is calibrated on the metamorphic audit's transformations among others; "
        "several scenarios are of the same kind (Gaussian noise, pixel shifts, brightness/contrast, rotation, "
        "blur, table noise and scaling). Each such scenario is estimated again by "
        f"`{RECOMMENDED_ESTIMATOR}` fitted without its kind (label-free, MAE / worst absolute error): the "
        "error to expect from a drift the calibration has not seen.",
        held_out_table(records, cells),
    )
    lines += _section(
        "Dependence on the calibration draw",
        f"`{RECOMMENDED_ESTIMATOR}`'s calibration is random (corruption strengths, windows, trees), seeded by "
        "`icos-agent fit --seed`. The same scenarios, label-free, estimated with the calibrations of other "
        "seeds: how much of a figure above is the draw rather than the method.",
        seed_table(records, cells, int(meta.get("seed", "0"))),
    )
    lines += _section(
        "Window size",
        f"A live window holds as many predictions as the traffic brings. `{RECOMMENDED_ESTIMATOR}` (shipped "
        "calibration) on windows of other sizes, each against the true accuracy of its own draw. The "
        "interval adds the window's sampling noise to the calibration's model error (see \"What the "
        'intervals mean"), so a small window widens it by that noise only.',
        size_table(records, cells, int(meta.get("size", "1000"))),
    )
    for model in models:
        lines += [f"### {meta.get('title:' + model, model)} — label-free (no IDIs)", ""]
        lines += scenario_table(records, cells, model)
        lines.append("")
    if any(k[1] != "none" for k in cells):
        lines += [
            "### With IDIs (metadata simulated from true-label partitions, ICOS §5.4)",
            "",
            "Mean MAE over scenarios / worst-scenario MAE.",
            "",
        ]
        lines += idi_table(cells, models)
        lines.append("")
    if plot_name:
        lines += [f"![MAE per scenario and estimator]({plot_name})", ""]
    return "\n".join(lines)


def write_doc(path: Path, generated: str) -> None:
    """Replace the generated section of ``path`` (create the file with a stub around it if needed)."""
    block = f"{BEGIN}\n{generated}\n{END}"
    if path.exists():
        text = path.read_text()
        if BEGIN in text and END in text:
            text = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _m: block, text, flags=re.S)
        else:
            text = text.rstrip() + "\n\n## Benchmark results\n\n" + block + "\n"
    else:
        text = "# Estimating accuracy without labels\n\n## Benchmark results\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def plot(records: Sequence[Record], path: Path) -> None:
    """One panel per model: label-free MAE per scenario (rows) and estimator (columns), log colour scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    cells = summarise(records)
    models = _ordered(records, "model")
    ests = [e for e in ESTIMATORS if any(k[3] == e for k in cells)]
    fig, axes = plt.subplots(1, len(models), figsize=(4.6 * len(models), 6.2), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        scen = _ordered([r for r in records if r.model == model], "scenario")
        grid = np.array([[cells[(model, "none", s, e)].mae for e in ests] for s in scen])
        ax.imshow(np.maximum(grid, 1e-3), cmap="viridis_r", norm=LogNorm(1e-3, 1.0), aspect="auto")
        for i in range(len(scen)):
            for j in range(len(ests)):
                v = grid[i, j]
                ax.text(
                    j,
                    i,
                    f"{v:.2f}" if v >= 0.005 else f"{v:.3f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if v > 0.1 else "black",
                )
        ax.set_xticks(range(len(ests)), ests, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(scen)), scen, fontsize=8)
        ax.set_title(f"{model}: MAE vs true accuracy (label-free)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def console(records: Sequence[Record], shipped_seed: int = 0, main_size: int = 1000) -> str:
    """Plain-text tables for the terminal."""
    cells = summarise(records)
    models = _ordered(records, "model")
    ests = [e for e in ESTIMATORS if any(k[3] == e for k in cells)]
    out: list[str] = []
    for model in models:
        idis = list(dict.fromkeys(k[1] for k in cells if k[0] == model))
        for idi in idis:
            cols = ests + [HELD_OUT] * (idi == "none" and (model, idi, "in_distribution", HELD_OUT) in cells)
            out.append(f"\n== {model} — IDI: {idi} — MAE / worst abs error ==")
            width = {e: max(17, len(e) + 2) for e in cols}
            out.append(f"{'scenario':28s}" + "".join(e.rjust(width[e]) for e in cols))
            for sc in _ordered([r for r in records if r.model == model], "scenario"):
                row = "".join(
                    f"{cells[(model, idi, sc, e)].mae:8.3f}/{cells[(model, idi, sc, e)].worst:.3f}".rjust(width[e])
                    for e in cols
                )
                out.append(f"{sc:28s}{row}")
            for label, attr in (
                ("mean MAE", "mean_mae"),
                ("worst-scenario MAE", "worst_scenario_mae"),
                ("worst error", "worst_error"),
                ("interval coverage", "coverage"),
            ):
                vals = [getattr(overall(cells, model, idi, e), attr) for e in cols]
                out.append(
                    f"{label:28s}" + "".join(f"{v:.3f}".rjust(width[e]) for e, v in zip(cols, vals, strict=True))
                )
    for model in models:
        by_seed = [
            f"seed {s:<4d} mean MAE {o.mean_mae:.4f}  worst-scenario MAE {o.worst_scenario_mae:.3f} ({w})  "
            f"coverage {o.coverage:.1%}"
            for s, o, w in seed_rows(cells, model, shipped_seed)
        ]
        by_size = [
            f"n={n:<6d} mean MAE {o.mean_mae:.4f}  worst-scenario MAE {o.worst_scenario_mae:.3f}  "
            f"coverage {o.coverage:.1%}  mean interval ±{h:.3f}"
            for n, o, h in size_rows(records, cells, model, main_size)
        ]
        for what, rows in (("calibration seed", by_seed), ("window size", by_size)):
            if len(rows) > 1:  # the shipped figures alone are in the tables above
                out += [f"\n== {model} — {RECOMMENDED_ESTIMATOR} by {what} (label-free) ==", *rows]
    tg = all_targets(cells, records)
    if tg:
        out.append("\n== targets: recommended estimator, label-free, against this run's baselines ==")
        out += [f"[{'PASS' if t.ok else 'FAIL'}] {m}: {t.text}: {t.value}" for m, t in tg]
    return "\n".join(out)
