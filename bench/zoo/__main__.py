"""``python -m bench.zoo``: build every zoo entry and print its inputs, size, build time and accuracy, in
distribution and under each shift at a few strengths (a fresh temporary work directory unless
``--workdir`` names one, so the build times include training and data generation)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.zoo import NAMES, build
from bench.zoo.string_locale import PORTABLE_LOCALE, default_locale_missing


def _shape(shape: tuple[object, ...]) -> str:
    return "[" + ", ".join("None" if d is None else str(d) for d in shape) + "]"


def report(name: str, workdir: Path, seed: int, strengths: list[float]) -> list[str]:
    options = {}
    note = ""
    if name == "text_tfidf" and default_locale_missing():
        options["locale"] = PORTABLE_LOCALE
        note = f" (exported with locale={PORTABLE_LOCALE}: en_US.UTF-8 is missing here)"
    t0 = time.perf_counter()
    model = build(name, workdir, seed, **options)
    seconds = time.perf_counter() - t0
    lines = [f"## {name}{note}"]
    for spec in model.inputs:
        lines.append(f"  input {spec.name}: {spec.v2_datatype} {_shape(spec.shape)}")
    lines.append(
        f"  classes ({len(model.classes)}): {', '.join(model.classes)}; scores: {model.scores_output} "
        f"({model.scores_kind}); penultimate: {model.penultimate or '-'}"
    )
    sizes = "/".join(str(len(getattr(model, p))) for p in ("train", "val", "test"))
    lines.append(f"  .onnx {model.path.stat().st_size / 1024:.0f} KiB; built in {seconds:.1f} s; splits {sizes}")
    accuracy = {p: model.accuracy(getattr(model, p)) for p in ("train", "val", "test")}
    lines.append("  accuracy: " + ", ".join(f"{p} {a:.3f}" for p, a in accuracy.items()))
    for kind in model.shifts:
        shifted = [model.accuracy(model.shift(model.test, s, seed=1, kind=kind)) for s in strengths]
        lines.append(f"  {kind}: " + ", ".join(f"{s:g} → {a:.3f}" for s, a in zip(strengths, shifted, strict=True)))
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.zoo", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"entries (default: all): {', '.join(NAMES)}")
    parser.add_argument("--workdir", type=Path, help="cache directory (default: a fresh temporary one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strengths", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in NAMES]
    if unknown:
        parser.error(f"no zoo entry {', '.join(unknown)}; entries: {', '.join(NAMES)}")
    with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
        workdir = args.workdir or Path(tmp)
        for name in args.names or NAMES:
            print("\n".join(report(name, workdir, args.seed, args.strengths)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
