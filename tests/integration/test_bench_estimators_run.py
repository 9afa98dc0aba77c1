"""The estimator benchmark runs end to end in quick mode (about two minutes on two cores): it rewrites
the generated part of its page, draws the plot and prints the summary. Figures are not asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.estimators.__main__ import main
from bench.estimators.report import BEGIN, END


@pytest.mark.timeout(900)
def test_quick_benchmark_writes_the_page_and_the_plot(tmp_path: Path, capsys: object) -> None:
    out = tmp_path / "estimation.md"
    out.write_text(f"# Title\n\nhand-written\n\n{BEGIN}\nstale generated text\n{END}\n\nmore hand-written\n")
    assert main(["--quick", "--models", "digits", "--reps", "2", "--out", str(out)]) == 0
    text = out.read_text()
    assert "hand-written" in text and "more hand-written" in text and "stale generated text" not in text
    assert "shift_aware" in text and "in_distribution" in text and "With IDIs" in text
    # every scenario with a kin among the calibration transformations is estimated again without it
    held = text.split("### Shifts of a kind held out of calibration")[1].split("###")[0]
    for scenario in ("gaussian_noise_strong", "translation_strong", "blur_strong", "mixture"):
        assert f"| digits | {scenario} |" in held
    assert "| in_distribution |" not in held and "all scenarios" in held
    assert (tmp_path / "img" / "estimation.png").stat().st_size > 1000
    printed = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "interval coverage" in printed and "digits" in printed and "shift_aware_held_out" in printed
    # shift_aware calibrated with another seed (quick mode: seed 1) is reported beside the shipped one
    draws = text.split("### Dependence on the calibration draw")[1].split("###")[0]
    assert "| digits | 0 (shipped) |" in draws and "| digits | 1 |" in draws and "range over 2 draws" in draws
    assert "shift_aware by calibration seed" in printed
    # shift_aware on windows of another size (quick mode: 100 besides the tables' 300)
    sizes = text.split("### Window size")[1].split("###")[0]
    assert "| digits | 100 |" in sizes and "| digits | 300 (the tables above) |" in sizes
    assert "shift_aware by window size" in printed and "n=100" in printed
