"""Build the icos-agent Grafana dashboard (JSON model, schemaVersion 39+).

``deploy/alerts/generate.py`` writes it to ``deploy/grafana/dashboards/icos-agent.json`` and copies it
into the Helm chart and the kustomize monitoring component. Templated on datasource, namespace,
model, version and estimate window. Every query reads raw agent metrics or the recording rules of
``deploy/alerts/source.yaml`` (``icos:*``); the test suite type-checks the JSON against
``@grafana/schema`` and parses every expression with promtool.
"""

from __future__ import annotations

from typing import Any

UID = "icos-agent"
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'namespace=~"$namespace", model=~"$model", version=~"$version"'
NS = 'namespace=~"$namespace"'


def _target(expr: str, legend: str, ref: str, *, instant: bool = False) -> dict[str, Any]:
    t: dict[str, Any] = {"datasource": DS, "refId": ref, "expr": expr, "legendFormat": legend, "range": not instant}
    if instant:
        t["instant"] = True
    return t


def _timeseries(
    title: str,
    targets: list[tuple[str, str]],
    grid: tuple[int, int, int, int],
    *,
    unit: str = "short",
    description: str = "",
    minmax: tuple[float, float] | None = None,
    overrides: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 0, "showPoints": "never", "spanNulls": False},
    }
    if minmax is not None:
        defaults["min"], defaults["max"] = minmax
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"x": grid[0], "y": grid[1], "w": grid[2], "h": grid[3]},
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {
            "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom", "calcs": []},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": [_target(e, lg, chr(ord("A") + i)) for i, (e, lg) in enumerate(targets)],
    }


def _stat(
    title: str, expr: str, legend: str, grid: tuple[int, int, int, int], *, unit: str, description: str = ""
) -> dict[str, Any]:
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"x": grid[0], "y": grid[1], "w": grid[2], "h": grid[3]},
        "fieldConfig": {"defaults": {"unit": unit, "decimals": 3}, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "orientation": "auto",
            "textMode": "value_and_name",
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "wideLayout": True,
            "showPercentChange": False,
            "percentChangeColorMode": "standard",
        },
        "targets": [_target(expr, legend, "A", instant=True)],
    }


def _row(title: str, y: int) -> dict[str, Any]:
    grid = {"x": 0, "y": y, "w": 24, "h": 1}
    return {"type": "row", "title": title, "collapsed": False, "gridPos": grid, "panels": []}


def _query_var(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DS,
        "query": {"query": query, "refId": f"var-{name}"},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "sort": 1,
    }


def _band_overrides() -> list[dict[str, Any]]:
    """Interval bounds as dashed lines in the colour of nothing in particular."""
    return [
        {
            "matcher": {"id": "byRegexp", "options": ".*(lower|upper).*"},
            "properties": [
                {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [4, 4]}},
                {"id": "custom.lineWidth", "value": 1},
            ],
        }
    ]


def _challenger_panels(p: list[dict[str, Any]], y: int) -> int:
    """A challenger beside the champion: the difference in accuracy with its interval, the agreement, and the
    challenger's own cost and drops. Returns the next free row."""
    p.append(_row("Champion and challenger", y))
    y += 1
    legend = "{{challenger}} vs {{model}} {{version}}"
    p.append(
        _timeseries(
            "Challenger minus champion accuracy (1h)",
            [
                (f"icos:challenger_difference:ratio1h{{{SEL}}}", legend + " {{estimator}} ({{source}})"),
                (f"icos:challenger_difference:ratio1h_lower{{{SEL}}}", legend + " lower"),
                (f"icos:challenger_difference:ratio1h_upper{{{SEL}}}", legend + " upper"),
            ],
            (0, y, 10, 8),
            unit="percentunit",
            description="The challenger's accuracy minus the champion's on the same requests and its 95% interval "
            "(recording rule icos:challenger_difference:ratio1h: the fleet's, or a replica's with labels on the "
            "disagreements, or the replicas' label-free mean). Above 0 with its whole interval: "
            "IcosChallengerBetter; below: IcosChallengerWorse.",
            overrides=_band_overrides(),
        )
    )
    p.append(
        _timeseries(
            "Agreement with the champion",
            [(f'max by (model, version, challenger) (icos_challenger_agreement_ratio{{{SEL}, window="1h"}})', legend)],
            (10, y, 7, 8),
            unit="percentunit",
            minmax=(0.0, 1.0),
            description="Share of paired predictions on which both versions predict the same class (the difference "
            "lives on the others).",
        )
    )
    p.append(
        _timeseries(
            "Challenger cost and drops",
            [
                (
                    f"sum by (challenger) (rate(icos_challenger_cpu_seconds_total{{{NS}}}[$__rate_interval])) / "
                    f"sum by (challenger) (rate(icos_challenger_predictions_total{{{NS}}}[$__rate_interval]))",
                    "{{challenger}} CPU s per prediction",
                ),
                (
                    f"sum by (challenger, reason) (rate(icos_challenger_dropped_total{{{NS}}}[$__rate_interval]))",
                    "{{challenger}} dropped/s {{reason}}",
                ),
            ],
            (17, y, 7, 8),
            description="The challenger's own CPU time per prediction (its thread: model, oracle, paired "
            "statistics) and the requests it did not predict, by reason (queue_full: raise challenger.queue_limit "
            "or lower challenger.share).",
        )
    )
    return y + 8


def panels() -> list[dict[str, Any]]:
    w = 'window=~"$window"'
    p: list[dict[str, Any]] = []
    y = 0
    p.append(_row("Estimated accuracy", y))
    y += 1
    p.append(
        _stat(
            "Headline estimate (1h)",
            f"icos:headline_accuracy:ratio1h{{{SEL}}}",
            "{{estimator}} ({{source}}) {{model}} {{version}}",
            (0, y, 6, 8),
            unit="percentunit",
            description="The headline estimate over the last hour (recording rule icos:headline_accuracy:ratio1h, "
            "which the accuracy alerts read): the fleet evaluator's where a fresh one runs (source fleet), else "
            "the agents' own headlines weighted by their predictions (source agents; with one replica, that "
            "agent's). The legend names the estimator: the bundle's headline, shift_aware, or doc.",
        )
    )
    p.append(
        _timeseries(
            "Headline estimate (95% interval) and reference accuracy",
            [
                (f"icos:headline_accuracy:ratio5m{{{SEL}}}", "{{estimator}} ({{source}}) 5m {{model}} {{version}}"),
                (f"icos:headline_accuracy:ratio1h{{{SEL}}}", "{{estimator}} ({{source}}) 1h {{model}} {{version}}"),
                (
                    f"icos:headline_accuracy:ratio1h_lower{{{SEL}}}",
                    "{{estimator}} ({{source}}) 1h lower {{model}} {{version}}",
                ),
                (
                    f"icos:headline_accuracy:ratio1h_upper{{{SEL}}}",
                    "{{estimator}} ({{source}}) 1h upper {{model}} {{version}}",
                ),
                (f"icos:reference_accuracy:ratio{{{SEL}}}", "reference {{model}} {{version}}"),
            ],
            (6, y, 18, 8),
            unit="percentunit",
            minmax=(0, 1),
            overrides=_band_overrides(),
            description="The headline estimate with its 95% interval, and the model's reference accuracy (on the "
            "bundle's calibration split). IcosEstimatedAccuracyLow fires when the 1h headline stays more than the "
            "margin (default 0.05) below the reference and the reference lies above its interval.",
        )
    )
    y += 8
    p.append(
        _timeseries(
            "Fleet estimates per estimator",
            [
                (
                    f"icos:fleet_estimated_accuracy:ratio1h{{{SEL}}}",
                    "{{estimator}} 1h (evaluator) {{model}} {{version}}",
                ),
                (f"icos:estimated_accuracy:ratio_rate1h{{{SEL}}}", "{{estimator}} 1h (counters) {{model}} {{version}}"),
            ],
            (0, y, 16, 8),
            unit="percentunit",
            minmax=(0, 1),
            description="Every estimator on all replicas' predictions (fleet evaluator), and the estimates "
            "recomputed from counters by the recording rules.",
        )
    )
    p.append(
        _stat(
            "Fleet evaluator age",
            f'time() - max by (model) (icos_fleet_last_success_timestamp_seconds{{{NS}, model=~"$model"}})',
            "{{model}}",
            (16, y, 8, 8),
            unit="s",
            description="Seconds since the fleet evaluator's last successful refresh (IcosFleetEvaluatorStale "
            "fires while it keeps failing).",
        )
    )
    y += 8
    p.append(
        _timeseries(
            "Estimated accuracy per estimator (95% intervals)",
            [
                (
                    f"avg by (estimator, window) (icos_estimated_accuracy_ratio{{{SEL}, {w}}})",
                    "{{estimator}} {{window}}",
                ),
                (
                    f"min by (estimator, window) (icos_estimated_accuracy_ratio_lower{{{SEL}, {w}}})",
                    "{{estimator}} {{window}} lower",
                ),
                (
                    f"max by (estimator, window) (icos_estimated_accuracy_ratio_upper{{{SEL}, {w}}})",
                    "{{estimator}} {{window}} upper",
                ),
            ],
            (0, y, 24, 9),
            unit="percentunit",
            minmax=(0, 1),
            overrides=_band_overrides(),
            description="Each replica's windowed estimates (icos, icos_corrected, avg_conf, cbpe, atc, doc, "
            "shift_aware, and with_labels in time windows whose labeling sample has labels); the band is the "
            "widest 95% interval over replicas.",
        )
    )
    y += 9
    p.append(
        _timeseries(
            "Estimate may be wrong (1: flag raised, by main reason)",
            [
                (f"max by (window, reason) (icos_estimate_flagged{{{SEL}, {w}}})", "{{window}} {{reason}}"),
                (f"max by (window, reason) (icos_fleet_estimate_flagged{{{SEL}, {w}}})", "fleet {{window}} {{reason}}"),
            ],
            (0, y, 12, 7),
            minmax=(0, 1),
            description="1 where a window's headline may be off by more than 0.05 (the flag, calibrated at fit on "
            "shifts the estimate was fitted without): its interval is widened and alert IcosEstimateMayBeWrong "
            "fires after 30 minutes. The reason names the main evidence; a change of class mix alone reads "
            "class_mix_changed with the flag down.",
        )
    )
    p.append(
        _timeseries(
            "Estimate trust distance (> 1: outside the calibrated range)",
            [(f"max by (window) (icos_estimate_trust_distance{{{SEL}, {w}}})", "{{window}}")],
            (12, y, 12, 7),
            description="How far each window lies from the windows the headline estimator was calibrated on, "
            "relative to their own spread (the farthest replica). Up to 1 the learnt correction is used whole; "
            "from 1 to 2 it is shrunk toward the confidence estimate (cbpe) and the interval widens. One of the "
            "flag's pieces of evidence.",
        )
    )
    y += 7
    p.append(
        _timeseries(
            "F1 per class: label-free (CBPE) and from delayed labels",
            [
                (
                    f'avg by (window) (icos_estimated_class_metric{{{SEL}, {w}, class="_macro", metric="f1"}})',
                    "estimated macro F1 {{window}}",
                ),
                (
                    f'avg by (window) (icos_realized_class_metric{{{SEL}, {w}, class="_macro", metric="f1"}})',
                    "realized macro F1 {{window}}",
                ),
                (
                    f'avg by (class) (icos_estimated_class_metric{{{SEL}, window="1h", class!~"_.*", metric="f1"}})',
                    "estimated F1 class {{class}} 1h",
                ),
            ],
            (0, y, 24, 8),
            unit="percentunit",
            minmax=(0, 1),
            description="Label-free F1 per predicted class (CBPE: the expected confusion matrix from the "
            "probabilities, as calibrated as the model is), its macro mean per window, and the macro F1 of the "
            "delayed labels where they exist. Per-class series exist for models with few classes only.",
        )
    )
    y += 8
    p.append(
        _timeseries(
            "Where the drop is: segments by contribution (1h)",
            [
                (
                    f"topk(5, icos:segment_contribution:ratio1h{{{SEL}}})",
                    "{{kind}} {{segment}} {{model}} {{version}}",
                ),
            ],
            (0, y, 16, 8),
            unit="percentunit",
            description="The five segments (fixed at fit: predicted class, a table column's value or bin, a TDI "
            "rule, a region of the inputs) that lost the most accuracy against their own reference over the last "
            "hour, times their share of the traffic (recording rule icos:segment_contribution:ratio1h: the fleet "
            "evaluator's, else the agents' mean). A segment within noise of its reference contributes 0; "
            "IcosSegmentAccuracyDrop names the top one. See docs/diagnosis.md.",
        )
    )
    p.append(
        _timeseries(
            "Segment accuracy against its reference (1h)",
            [
                (
                    f'avg by (kind, segment) (icos_segment_estimated_accuracy_ratio{{{SEL}, window="1h"}}) '
                    f"and on (kind, segment) topk(5, max by (kind, segment) "
                    f"(icos:segment_contribution:ratio1h{{{SEL}}}))",
                    "{{segment}} estimated",
                ),
                (
                    f"avg by (kind, segment) (icos_segment_reference_accuracy_ratio{{{SEL}}}) "
                    f"and on (kind, segment) topk(5, max by (kind, segment) "
                    f"(icos:segment_contribution:ratio1h{{{SEL}}}))",
                    "{{segment}} reference",
                ),
            ],
            (16, y, 8, 8),
            unit="percentunit",
            minmax=(0, 1),
            description="The estimated accuracy of the five segments that lost the most, beside their accuracy on "
            "the bundle's validation data.",
        )
    )
    y += 8
    p.append(
        _timeseries(
            "What changed: segments by change score (1h)",
            [
                (
                    f"topk(5, icos:segment_change:score1h{{{SEL}}} > 0)",
                    "{{kind}} {{segment}}: {{column}} {{model}} {{version}}",
                ),
            ],
            (0, y, 16, 8),
            description="The five segments whose inputs moved the most from their own at fit over the last hour, "
            "label-free, with the input that moved most (recording rule icos:segment_change:score1h: the fleet "
            "evaluator's, else the largest of the agents'; 0, not shown: no change beyond noise). A model "
            "confidently wrong on changed inputs moves no estimate above, but its inputs moved: "
            "IcosSegmentAccuracyDrop names the top one. See docs/diagnosis.md.",
        )
    )
    p.append(
        _stat(
            "Change across the traffic (1h)",
            f"icos:segment_change_widespread:1h{{{SEL}}}",
            "{{model}} {{version}}",
            (16, y, 8, 8),
            unit="bool_yes_no",
            description="Yes when the last hour's change is across the traffic, in no one segment: in every "
            "dimension, segments whose inputs changed hold half the predictions or more (recording rule "
            "icos:segment_change_widespread:1h). The segments above are then only where the change is largest; "
            "the headline and labels drawn across the traffic say how much it costs.",
        )
    )
    y += 8
    p.append(_row("Verdicts", y))
    y += 1
    p.append(
        _timeseries(
            "Failed predictions by invariant family",
            [
                (
                    f'sum by (invariant) (rate(icos_verdicts_total{{verdict="fail", {SEL}}}[$__rate_interval]))',
                    "{{invariant}}",
                )
            ],
            (0, y, 8, 8),
            unit="reqps",
            description="Predictions per second failed by the first violated family (IDI, then TDI, then ADI).",
        )
    )
    p.append(
        _timeseries(
            "Fail share by family (estimate window)",
            [(f"avg by (invariant, window) (icos_window_fail_ratio{{{SEL}, {w}}})", "{{invariant}} {{window}}")],
            (8, y, 8, 8),
            unit="percentunit",
        )
    )
    p.append(
        _timeseries(
            "Judged predictions",
            [
                (
                    f"sum by (model, version) (rate(icos_predictions_total{{{SEL}}}[$__rate_interval]))",
                    "{{model}} {{version}}",
                )
            ],
            (16, y, 8, 8),
            unit="reqps",
        )
    )
    y += 8
    p.append(_row("Requests and latency", y))
    y += 1
    p.append(
        _timeseries(
            "Invalid requests by reason",
            [(f"sum by (reason) (rate(icos_invalid_requests_total{{{NS}}}[$__rate_interval]))", "{{reason}}")],
            (0, y, 8, 8),
            unit="reqps",
        )
    )
    lat = []
    for metric, name in (("icos_inference_duration_seconds", "inference"), ("icos_oracle_duration_seconds", "oracle")):
        for q in ("0.5", "0.9", "0.99"):
            lat.append(
                (
                    f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{SEL}}}[$__rate_interval])))",
                    f"{name} p{q[2:].ljust(2, '0')}",
                )
            )
    p.append(_timeseries("Latency quantiles per batch", lat, (8, y, 16, 8), unit="s"))
    y += 8
    y = _challenger_panels(p, y)
    p.append(_row("Robustness audits", y))
    y += 1
    p.append(
        _timeseries(
            "D-Score",
            [
                (f"max by (job) (icos_dscore{{{NS}}})", "D-Score {{job}}"),
                (f"max by (job) (icos_dscore_baseline{{{NS}}})", "baseline {{job}}"),
                (f"max by (job) (icos_dscore_fitness{{{NS}}})", "fitness {{job}}"),
                (f"max by (job) (icos_dscore_robustness{{{NS}}})", "robustness {{job}}"),
            ],
            (0, y, 8, 8),
            description="D-Score = v_fitness - v_robust (D-Score paper, section IV, eqs. 3, 4 and 6) of the last "
            "successful audit, and its baseline (configured, else the first audit's for the model); "
            "IcosDScoreDegraded fires when it falls more than 0.05 below the baseline.",
        )
    )
    p.append(
        _timeseries(
            "Time since last successful audit",
            [(f"time() - max by (audit) (icos_audit_last_success_timestamp_seconds{{{NS}}})", "{{audit}}")],
            (8, y, 8, 8),
            unit="s",
        )
    )
    p.append(
        _timeseries(
            "Audit runs by status",
            [
                (
                    f"sum by (audit, status) (increase(icos_audit_runs_total{{{NS}}}[$__rate_interval]))",
                    "{{audit}} {{status}}",
                )
            ],
            (16, y, 8, 8),
        )
    )
    y += 8
    p.append(
        _timeseries(
            "Data mutation: relative change of the model's error",
            [
                (
                    f'max by (metric, operator) (icos_mutation_relative_change_ratio{{{NS}, metric=~"mae|rmse"}})',
                    "{{operator}} {{metric}}",
                )
            ],
            (0, y, 12, 8),
            unit="percentunit",
            description="Mean relative change of MAE/RMSE after DEC, IMP, SGN and DIG mutations (0.25 = +25%).",
        )
    )
    p.append(
        _timeseries(
            "Metamorphic violation rate by relation",
            [(f"max by (relation) (icos_metamorphic_violation_ratio{{{NS}}})", "{{relation}}")],
            (12, y, 12, 8),
            unit="percentunit",
            description="Share of inputs whose predicted label changes under a label-preserving transformation.",
        )
    )
    for i, panel in enumerate(p, start=1):
        panel["id"] = i
    return p


def build() -> dict[str, Any]:
    """The dashboard JSON model."""
    return {
        "uid": UID,
        "title": "icos-agent: operational accuracy",
        "description": "Label-free accuracy estimates, oracle verdicts, latency and robustness audits of models "
        "watched by icos-agent.",
        "tags": ["icos-agent", "ml", "accuracy"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "fiscalYearStartMonth": 0,
        "links": [],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {
            "list": [
                {
                    "type": "datasource",
                    "name": "datasource",
                    "label": "Data source",
                    "query": "prometheus",
                    "current": {"text": "Prometheus", "value": "prometheus"},
                    "hide": 0,
                    "refresh": 1,
                },
                _query_var("namespace", "Namespace", "label_values(icos_predictions_total, namespace)"),
                _query_var("model", "Model", 'label_values(icos_predictions_total{namespace=~"$namespace"}, model)'),
                _query_var(
                    "version",
                    "Version",
                    'label_values(icos_predictions_total{namespace=~"$namespace", model=~"$model"}, version)',
                ),
                _query_var("window", "Estimate window", "label_values(icos_estimated_accuracy_ratio, window)"),
            ]
        },
        "panels": panels(),
    }


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the panels, with template variables replaced by valid stand-ins."""
    out = []
    for panel in dashboard["panels"]:
        for t in panel.get("targets", []):
            expr = t["expr"]
            for var, value in (
                ("$__rate_interval", "5m"),
                ("$namespace", ".*"),
                ("$model", ".*"),
                ("$version", ".*"),
                ("$window", ".*"),
            ):
                expr = expr.replace(var, value)
            out.append(expr)
    return out
