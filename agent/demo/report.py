"""The demo's report: ``<report dir>/index.html`` (self-contained, relative PNG paths) with the
estimates beside the truth over time, the verdict mix per phase, D-Score heatmaps, mutation and
metamorphic results, the MLflow runs and the commands to look further. Plots use matplotlib's Agg
canvas (no display needed)."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent.demo.record import DemoRecord, drop_line

PNG_ESTIMATES = "estimates_vs_truth.png"
PNG_VERDICTS = "verdict_mix.png"
PNG_DSCORE = "dscore_heatmaps.png"
PNG_MUTATION = "mutation.png"
PNG_METAMORPHIC = "metamorphic.png"
VERDICT_COLORS = {"pass": "#4caf50", "fail:idi": "#9c27b0", "fail:tdi": "#ff9800", "fail:adi": "#e53935"}


def _figure(w: float, h: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, format="png")


# -- plots ----------------------------------------------------------------------------------------------
def plot_estimates(record: DemoRecord, path: Path) -> None:
    """Every estimator's count-window estimate and the truth of the same predictions, over the replay;
    the headline's 95 % interval shaded; phase boundaries marked."""
    fig = _figure(10, 4.6)
    ax = fig.add_subplot()
    trace = record.trace
    x = np.array([t.sent for t in trace], dtype=float)
    ax.plot(x, [t.truth for t in trace], color="black", lw=2.6, label="truth (same predictions)", zorder=5)
    for name in record.estimators:
        vals = np.array([t.estimates.get(name, (np.nan, np.nan, np.nan)) for t in trace], dtype=float)
        headline = name == record.headline
        line = ax.plot(x, vals[:, 0], lw=2.0 if headline else 1.1, label=name + (" (headline)" if headline else ""))
        if headline:
            ax.fill_between(x, vals[:, 1], vals[:, 2], color=line[0].get_color(), alpha=0.18, lw=0)
    edge = 0
    for p in record.phases:
        ax.axvline(edge, color="grey", lw=0.7, ls=":")
        ax.text(
            edge + p.sent / 2, 1.005, p.name, ha="center", va="bottom", fontsize=8, transform=ax.get_xaxis_transform()
        )
        edge += p.sent
    ax.set_xlim(0, max(edge, 1))
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("predictions sent")
    ax.set_ylabel(f"accuracy over the last {record.window_size} predictions")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8, ncol=2)
    _save(fig, path)


def plot_verdicts(record: DemoRecord, path: Path) -> None:
    """Stacked shares of pass and fail verdicts (by family) per phase."""
    fig = _figure(7, 3.4)
    ax = fig.add_subplot()
    names = [p.name for p in record.phases]
    bottom = np.zeros(len(names))
    for verdict, color in VERDICT_COLORS.items():
        shares = np.array([p.verdict_shares().get(verdict, 0.0) for p in record.phases])
        if verdict != "pass" and not shares.any():
            continue
        ax.bar(names, shares, bottom=bottom, color=color, label=verdict)
        bottom += shares
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of predictions")
    ax.legend(fontsize=8, loc="lower right")
    ax.tick_params(axis="x", labelsize=8)
    _save(fig, path)


def plot_dscore(result: dict[str, Any], path: Path) -> None:
    """``n × n`` grids: feature distribution f̃ (eq. 1), attention ã (eq. 2), variant and translated
    accuracies (D-Score §IV-A; region 0 is the upper-left corner)."""
    details = result.get("details", {})
    score = details.get("score", {})
    n = int(result.get("params", {}).get("n", 3))
    panels = [
        ("feature distribution f̃ (eq. 1)", score.get("feature_distribution")),
        ("attention distribution ã (eq. 2)", score.get("attention_distribution")),
        ("accuracy with region deleted", details.get("variant_accuracies")),
        ("accuracy translated to region", details.get("translated_accuracies")),
    ]
    fig = _figure(10, 2.9)
    for i, (title, values) in enumerate(panels):
        ax = fig.add_subplot(1, 4, i + 1)
        if not values:
            ax.set_axis_off()
            continue
        grid = np.asarray(values, dtype=float).reshape(n, n)
        im = ax.imshow(grid, cmap="viridis")
        for (r, c), v in np.ndenumerate(grid):
            ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=8, color="w" if v < grid.mean() else "k")
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set_title(title, fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    _save(fig, path)


def plot_mutation(result: dict[str, Any], path: Path) -> None:
    """Relative change (%) of MAE, MSE, RMSE and accuracy per operator group, ± one std."""
    summary = result.get("details", {}).get("summary", {})
    groups = [g for g, v in summary.items() if isinstance(v, dict) and "mae" in v]
    metrics = ("mae", "mse", "rmse", "accuracy")
    fig = _figure(7, 3.4)
    ax = fig.add_subplot()
    width = 0.8 / len(metrics)
    for j, metric in enumerate(metrics):
        means = [summary[g][metric]["change_pct_mean"] or 0.0 for g in groups]
        stds = [summary[g][metric]["change_pct_std"] or 0.0 for g in groups]
        ax.bar(np.arange(len(groups)) + (j - 1.5) * width, means, width, yerr=stds, capsize=2, label=metric.upper())
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.set_ylabel("relative change after mutation (%)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def plot_metamorphic(result: dict[str, Any], path: Path) -> None:
    """Violation rate per relation with its Wilson 95 % interval."""
    rels = result.get("details", {}).get("relations", [])
    fig = _figure(7, 0.45 * max(len(rels), 2) + 1.2)
    ax = fig.add_subplot()
    names = [str(r["relation"]) for r in rels]
    rates = np.array([r["violation_rate"] or 0.0 for r in rels])
    lo = np.array([r.get("violation_rate_lower") or 0.0 for r in rels])
    hi = np.array([r.get("violation_rate_upper") or 0.0 for r in rels])
    ax.barh(names, rates, xerr=[np.maximum(rates - lo, 0), np.maximum(hi - rates, 0)], color="#3f51b5", capsize=3)
    ax.invert_yaxis()
    ax.set_xlabel("violation rate (share of inputs whose label changed)")
    ax.grid(axis="x", alpha=0.3)
    _save(fig, path)


# -- HTML -----------------------------------------------------------------------------------------------
CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Roboto, sans-serif; margin: 2em auto; max-width: 72em;
       color: #222; line-height: 1.45; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
tr.headline td { font-weight: bold; background: #f3f7ff; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
code, pre { background: #f6f6f6; border-radius: 3px; }
pre { padding: 0.7em; overflow-x: auto; }
.muted { color: #666; font-size: 0.9em; }
"""


def _e(text: object) -> str:
    return html.escape(str(text))


def _table(head: Sequence[str], rows: Sequence[Sequence[object]], classes: Sequence[str] | None = None) -> str:
    out = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for i, r in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _fmt(v: Any, digits: int = 3) -> str:
    return "-" if v is None else f"{float(v):.{digits}f}"


def _phase_table(record: DemoRecord) -> str:
    head = ["", *[p.name for p in record.phases]]
    rows: list[list[object]] = [
        ["description", *[p.description for p in record.phases]],
        ["predictions", *[p.sent for p in record.phases]],
        ["truth", *[_fmt(p.accuracy) for p in record.phases]],
    ]
    classes = ["", "", "headline"]
    if any(p.realized is not None for p in record.phases):
        rows.append(["realized (delayed labels)", *[_fmt(p.realized) for p in record.phases]])
        classes.append("")
    for name in record.estimators:
        cells = []
        for p in record.phases:
            e = p.estimates.get(name)
            caveat = " (unreliable)" if name in p.unreliable else ""
            cells.append("-" if not e else f"{e.to_text()}{caveat}")
        rows.append([name + (" (headline)" if name == record.headline else ""), *cells])
        classes.append("headline" if name == record.headline else "")
    for name in record.estimators:
        errs = []
        for p in record.phases:
            e = p.estimates.get(name)
            errs.append("-" if not e or p.accuracy is None else f"{e.error(p.accuracy):.3f}")
        rows.append([f"|error| {name}", *errs])
        classes.append("")
    rows.append(["where the drop is (segments)", *[drop_line(p.drop) for p in record.phases]])
    classes.append("")
    verdicts = sorted({v for p in record.phases for v in p.verdicts}, key=lambda v: (v != "pass", v))
    for v in verdicts:
        rows.append([f"verdict {v}", *[f"{p.verdict_shares().get(v, 0.0):.1%}" for p in record.phases]])
        classes.append("")
    return _table(head, rows, classes)


def _audit_section(kind: str, outcome: dict[str, Any] | None, images: dict[str, str]) -> str:
    title = {"dscore": "D-Score", "mutation": "Data mutation", "metamorphic": "Metamorphic testing"}[kind]
    if outcome is None:
        return f"<h3>{title}</h3><p>not run</p>"
    parts = [f"<h3>{title}</h3>"]
    status = outcome.get("status")
    run = (outcome.get("mlflow") or {}).get("run_id")
    parts.append(
        f"<p class='muted'>status <b>{_e(status)}</b>, {outcome.get('n_samples')} inputs from "
        f"{_e(outcome.get('data_source'))}, {float(outcome.get('seconds', 0)):.1f} s"
        + (f", MLflow run <code>{_e(run)}</code>" if run else "")
        + "</p>"
    )
    result = outcome.get("result")
    if status != "success" or not result:
        parts.append(f"<p>{_e(outcome.get('error') or 'no result')}</p>")
        return "\n".join(parts)
    parts += {"dscore": _dscore_html, "mutation": _mutation_html, "metamorphic": _metamorphic_html}[kind](result)
    if kind in images:
        parts.append(f'<img src="{images[kind]}" alt="{title} results">')
    return "\n".join(parts)


def _dscore_html(result: dict[str, Any]) -> list[str]:
    m = result.get("metrics", {})
    keys = ("dscore", "fitness", "robustness", "base_accuracy", "g", "augmentation_probability")
    return [
        _table(
            [
                "D-Score (eq. 6)",
                "fitness (eq. 3)",
                "robustness (eq. 4)",
                "base accuracy",
                "g(n) (eq. 5)",
                "p (eq. 7)",
            ],
            [[_fmt(m.get(k)) for k in keys]],
        )
    ]


def _mutation_html(result: dict[str, Any]) -> list[str]:
    summary = result.get("details", {}).get("summary", {})
    rows = []
    for g, v in summary.items():
        if isinstance(v, dict) and "mae" in v:
            rows.append(
                [g]
                + [
                    f"{v[k]['change_pct_mean']:+.2f} ± {v[k]['change_pct_std']:.2f}"
                    if v[k]["change_pct_mean"] is not None
                    else "-"
                    for k in ("mae", "mse", "rmse", "accuracy")
                ]
            )
    base = result.get("details", {}).get("baseline", {})
    return [
        "<p>Baseline: "
        + ", ".join(f"{k.upper()} {_fmt(base.get(k), 4)}" for k in ("mae", "mse", "rmse", "accuracy"))
        + f"; k = {_e(result.get('params', {}).get('k'))} cells per repetition, "
        f"{_e(result.get('params', {}).get('repetitions'))} repetitions.</p>",
        _table(["operator", "MAE change %", "MSE change %", "RMSE change %", "accuracy change %"], rows),
    ]


def _metamorphic_html(result: dict[str, Any]) -> list[str]:
    m = result.get("metrics", {})
    rels = result.get("details", {}).get("relations", [])
    rows = [
        [
            r["relation"],
            r["n"],
            f"{r['violation_rate']:.3f} [{_fmt(r.get('violation_rate_lower'))}, {_fmt(r.get('violation_rate_upper'))}]",
            _fmt(r.get("mean_confidence_drop"), 4),
            "-" if r.get("wilcoxon_p") is None else f"{r['wilcoxon_p']:.2g}",
        ]
        for r in rels
    ]
    rows.append(
        [
            "all (pooled)",
            "",
            f"{m.get('overall_violation_rate', 0):.3f} [{_fmt(m.get('overall_violation_rate_lower'))}, "
            f"{_fmt(m.get('overall_violation_rate_upper'))}]",
            _fmt(m.get("overall_mean_confidence_drop"), 4),
            "",
        ]
    )
    return [
        _table(["relation", "n", "violation rate [95% CI]", "mean confidence drop", "Wilcoxon p"], rows),
        f"<p>Inputs violating at least one relation: {_fmt(m.get('any_violation_rate'))}.</p>",
    ]


def write_report(record: DemoRecord, report_dir: Path, commands: Sequence[tuple[str, str]]) -> Path:
    """Write ``index.html``, its PNGs and ``demo.json`` into ``report_dir``; the HTML's path."""
    report_dir.mkdir(parents=True, exist_ok=True)
    plot_estimates(record, report_dir / PNG_ESTIMATES)
    plot_verdicts(record, report_dir / PNG_VERDICTS)
    images: dict[str, str] = {}
    plotters = {"dscore": (plot_dscore, PNG_DSCORE), "mutation": (plot_mutation, PNG_MUTATION)}
    plotters["metamorphic"] = (plot_metamorphic, PNG_METAMORPHIC)
    for kind, (plot, name) in plotters.items():
        outcome = record.audits.get(kind)
        if outcome and outcome.get("status") == "success" and outcome.get("result"):
            plot(outcome["result"], report_dir / name)
            images[kind] = name
    (report_dir / "demo.json").write_text(json.dumps(record.to_dict(), indent=1, default=str), encoding="utf-8")
    info = record.info
    mlflow_rows = [[kind, run or "(spooled: delivered later)"] for kind, run in record.mlflow_runs.items()]
    body = [
        "<h1>icos-agent demo: label-free accuracy of the shipped MNIST CNN</h1>",
        f"<p class='muted'>{_e(info.get('when', ''))} — model <code>{_e(info.get('model', ''))}</code> "
        f"(sha256 {_e(str(info.get('sha256', ''))[:12])}…), served by the agent at {_e(info.get('url', ''))}; "
        f"{record.total_sent} live predictions in {len(record.phases)} phases; whole run "
        f"{float(info.get('seconds', 0)):.0f} s.</p>",
        "<p>The agent judged every prediction with the ICOS invariants (pass, or fail by the first violated "
        "family) and estimated the accuracy <b>without labels</b>. The demo knows the labels, so it shows the "
        "truth beside every estimate. Each column is the agent's count window "
        f"(<code>{_e(record.window)}</code>) at the end of the phase: exactly that phase's predictions.</p>",
        f"<p>Oracle calibration: TPR {_fmt(info.get('tpr'))}, FPR {_fmt(info.get('fpr'))} "
        f"(share of wrong / right predictions failed, on the held-out calibration split).</p>",
        "<h2>Estimates and truth per phase</h2>",
        _phase_table(record),
        "<h2>Estimates over time</h2>",
        f'<img src="{PNG_ESTIMATES}" alt="estimates versus truth over time">',
        "<p class='muted'>Each point: the agent's estimates over the last "
        f"{record.window_size} predictions and the true accuracy of the same predictions. The shaded band is the "
        f"95 % interval of the headline estimator ({_e(record.headline)}).</p>",
        "<h2>Verdict mix per phase</h2>",
        f'<img src="{PNG_VERDICTS}" alt="verdict mix per phase">',
        "<h2>Robustness audits</h2>",
        "<p>Run by the agent on request (<code>POST /v1/audits/{kind}?wait=true</code>); D-Score and mutation "
        "on the labeled reference set (the MNIST test split), metamorphic on the live inputs the agent kept "
        "(label-free). How to read them: <code>docs/audits.md</code>.</p>",
        *[_audit_section(k, record.audits.get(k), images) for k in ("dscore", "mutation", "metamorphic")],
        "<h2>MLflow runs</h2>",
        _table(["run", "run id"], mlflow_rows) if mlflow_rows else "<p>none</p>",
        "<h2>Look further</h2>",
        "<pre>" + "\n".join(f"# {_e(what)}\n{_e(cmd)}" for what, cmd in commands) + "</pre>",
        "<p class='muted'>Raw numbers: <a href='demo.json'>demo.json</a>"
        + (
            ", <a href='metrics.txt'>metrics.txt</a> (the agent's /metrics at the end)"
            if (report_dir / "metrics.txt").exists()
            else ""
        )
        + ".</p>",
    ]
    page = (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<title>icos-agent demo report</title>"
        f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
    index = report_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index
