"""The figures of :class:`~icos_agent.estimates.Estimates` and its one-page report.

matplotlib, not plotly: matplotlib is already a dependency (the demo's report and the audits' heatmaps draw with
it) and plotly is not; a static PNG embedded as base64 makes a page that needs no script and fetches nothing when
it is viewed (plotly's page carries its whole JavaScript library inline, or fetches it from a CDN), opens in any
browser, mail client or CI artifact viewer, and a :class:`~matplotlib.figure.Figure` shows itself in a notebook.
Figures are built without ``pyplot``, so nothing global changes in the caller's session.
"""

from __future__ import annotations

import base64
import html
import io
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from icos_agent.estimates import Estimates

#: Segments a segments figure shows (those that lost the most).
TOP_SEGMENTS = 12
#: Characters of a segment's label on the figure's axis.
LABEL_WIDTH = 40


def _figure(width: float = 9.0, height: float = 4.0) -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


def _x(df: pd.DataFrame, by_time: bool) -> Any:
    """Time windows on a time axis (their starts, UTC); windows of rows at their first row."""
    if by_time:
        return df["window_start"].dt.tz_convert(None).to_numpy()
    return df["window_start"].to_numpy()


def accuracy_figure(df: pd.DataFrame, headline: str, by_time: bool) -> Figure:
    """The headline per window with its interval band, the realized accuracy beside it, the reference accuracy and
    the alert threshold as lines, windows whose flag is raised marked (the flag: the number may be wrong) and
    windows that alert circled."""
    import numpy as np

    fig, ax = _figure()
    x = _x(df, by_time)
    value = df["value"].astype(float).to_numpy()
    ax.fill_between(
        x, df["lower"].astype(float), df["upper"].astype(float), alpha=0.25, step=None, label="95% interval"
    )
    ax.plot(x, value, marker="o", markersize=3, label=f"estimate ({headline})")
    realized = df["realized"].astype(float).to_numpy()
    if np.isfinite(realized).any():
        ax.plot(x, realized, marker="s", markersize=3, linestyle="--", color="black", label="realized (labels)")
    ax.axhline(float(df["reference_accuracy"].iloc[0]), color="tab:green", linestyle=":", label="reference accuracy")
    ax.axhline(float(df["alert_threshold"].iloc[0]), color="tab:red", linestyle=":", label="alert threshold")
    flagged = df["flag_raised"].fillna(False).astype(bool).to_numpy()
    if flagged.any():
        ax.scatter(x[flagged], value[flagged], marker="x", s=60, color="tab:orange", zorder=3, label="flag raised")
    alerted = df["alert"].fillna(False).astype(bool).to_numpy()
    if alerted.any():
        ax.scatter(x[alerted], value[alerted], s=140, facecolors="none", edgecolors="tab:red", zorder=3, label="alert")
    return _finished(fig, ax, "accuracy", "Estimated accuracy per window", by_time)


def _short(label: str, width: int = LABEL_WIDTH) -> str:
    """A segment's label cut to ``width`` characters (a TDI rule's text can be long); the table keeps it whole."""
    return label if len(label) <= width else label[: width - 1] + "…"


def segments_figure(df: pd.DataFrame) -> Figure:
    """The segments that lost the most over every row: each one's contribution to the drop (its share times what
    it lost against its reference accuracy), largest first."""
    fig, ax = _figure(9.0, 4.5)
    if df.empty:
        ax.text(0.5, 0.5, "the bundle has no segments", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    top = df.sort_values("rank").head(TOP_SEGMENTS).iloc[::-1]
    labels = [_short(f"{d}: {s}") for d, s in zip(top["dimension"], top["segment"], strict=True)]
    colors = ["tab:red" if c > 0 else "tab:blue" for c in top["contribution"]]
    ax.barh(labels, top["contribution"].astype(float), color=colors)
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("contribution to the drop in accuracy (share × loss against its reference)")
    ax.set_title("Where the drop is: segments ranked by what they lost")
    ax.tick_params(axis="y", labelsize="small")
    ax.grid(axis="x", alpha=0.3)
    return fig


def challenger_figure(df: pd.DataFrame, by_time: bool) -> Figure:
    """The challenger's accuracy minus the model's per window, with its interval band, and the realized difference
    where every row is labeled."""
    import numpy as np

    fig, ax = _figure()
    x = _x(df, by_time)
    ax.fill_between(x, df["lower"].astype(float), df["upper"].astype(float), alpha=0.25, label="95% interval")
    ax.plot(x, df["value"].astype(float), marker="o", markersize=3, label="challenger − model (estimate)")
    realized = df["realized"].astype(float).to_numpy()
    if np.isfinite(realized).any():
        ax.plot(x, realized, marker="s", markersize=3, linestyle="--", color="black", label="realized (labels)")
    ax.axhline(0.0, color="black", linewidth=0.8)
    return _finished(fig, ax, "difference in accuracy", "Challenger against the model, per window", by_time)


def _finished(fig: Figure, ax: Axes, ylabel: str, title: str, by_time: bool) -> Figure:
    """``fig`` with the axes, title, grid and legend every per-window figure has."""
    ax.set_ylabel(ylabel)
    ax.set_xlabel("window start (UTC)" if by_time else "first row of the window")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize="small")
    return fig


def png_data_uri(fig: Figure) -> str:
    """The figure as an ``<img>`` source: a PNG in a ``data:`` URI (nothing to fetch)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _table(df: pd.DataFrame) -> str:
    return str(df.to_html(index=False, float_format=lambda v: f"{v:.4f}", na_rep="", border=0, escape=True))


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 12px; }
th, td { padding: 2px 8px; border-bottom: 1px solid #ddd; text-align: right; }
th { background: #f4f4f4; }
.wide { overflow-x: auto; max-width: 100%; }
img { max-width: 100%; }
"""


def html_page(est: Estimates) -> str:
    """The page of :meth:`~icos_agent.estimates.Estimates.save_html`."""
    windows = est.to_df()
    n, fails = int(est.windowed.total.n), int(windows["fails"].sum())
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>icos-agent estimates</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>Estimated accuracy</h1>",
        f"<p>{n} predictions in {len(windows)} window(s), {fails} failed an invariant; headline estimator "
        f"<b>{html.escape(est.headline)}</b>; reference accuracy {est.reference_accuracy:.4f}, alert threshold "
        f"{est.alert_threshold:.4f}.</p>",
        f'<img alt="estimated accuracy per window" src="{png_data_uri(est.plot("accuracy"))}">',
        "<h2>Windows</h2>",
        f'<div class="wide">{_table(windows)}</div>',
        "<h2>Segments</h2>",
        f'<img alt="segments ranked by what they lost" src="{png_data_uri(est.plot("segments"))}">',
    ]
    segments = est.segments_df(every_row=True)
    if not segments.empty:
        cols = [c for c in segments.columns if c not in ("window_start", "window_end")]
        parts.append(f'<div class="wide">{_table(segments[cols].head(50))}</div>')
    if est.paired is not None:
        parts += [
            "<h2>Challenger</h2>",
            f'<img alt="challenger against the model" src="{png_data_uri(est.plot("challenger"))}">',
            f'<div class="wide">{_table(est.challenger_df())}</div>',
        ]
    parts.append("</body></html>")
    return "\n".join(parts)
