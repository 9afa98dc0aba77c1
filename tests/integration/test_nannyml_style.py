"""Performance estimation on tables like NannyML's synthetic data sets (built in
:mod:`bench.headline.nannyml_style`, nothing downloaded): fit from the reference period, check the analysis
period in chunks of 1,000 rows (NannyML's size-based chunking), and the headline estimate tracks the
accuracy measured with the labels, falling when it falls under the covariate shift of the last chunks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from agent.cli import main
from agent.data.tables import resolve_columns
from agent.offline.tables import check_table_report
from bench.headline.nannyml_style import CHUNK, Table, car_loan, credit_card
from invariants.bundle import Bundle

#: Largest |headline estimate − accuracy| allowed in a chunk of 1,000 rows (the accuracy's own sampling
#: standard deviation there is about 0.013; measured errors are at most 0.03, see docs/estimation.md).
TOLERANCE = 0.05


@pytest.mark.parametrize("make", [car_loan, credit_card], ids=["car_loan_binary", "credit_card_3_classes"])
def test_headline_tracks_accuracy_per_chunk(make: Callable[..., Table], tmp_path: Path) -> None:
    table = make(n_reference=5000, n_analysis=6000, seed=0)
    ref, ana = tmp_path / "reference.parquet", tmp_path / "analysis.parquet"
    table.period("reference").to_parquet(ref)
    table.period("analysis").to_parquet(ana)
    cols = ["--proba-columns", ",".join(table.proba), "--feature-columns", ",".join(table.features)]
    argv = ["fit", "--reference", str(ref), "--label-column", table.label, *cols, "--trees", "50"]
    assert main([*argv, "--out", str(tmp_path / "b"), "--json"]) == 0
    bundle = Bundle.load(tmp_path / "b")
    columns, _ = resolve_columns(ana, proba=table.proba, label=table.label, features=table.features)
    report = check_table_report(bundle, ana, columns, chunk_rows=CHUNK, batch_rows=4096)
    chunks = report["chunks"]
    assert len(chunks) == 6 and all(c["n"] == CHUNK for c in chunks)
    headline = report["headline"]
    est = np.array([c["estimates"][headline]["value"] for c in chunks])
    truth = np.array([c["truth"]["accuracy"] for c in chunks])
    assert np.abs(est - truth).max() <= TOLERANCE, list(zip(est.round(4), truth.round(4), strict=True))
    # the shift of the last three chunks costs accuracy, and the estimate falls with it
    truth_drop = truth[:3].mean() - truth[3:].mean()
    est_drop = est[:3].mean() - est[3:].mean()
    assert truth_drop > 0.03
    assert est_drop > truth_drop / 2
