"""Run benchmarks: ``python -m bench [name ...]`` (default: the quick ones)."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "oracle": "bench.bench_oracle",
    "dscore": "bench.bench_dscore",
    "serving": "bench.serving.__main__",
    "durability": "bench.bench_durability",
    "store": "bench.bench_store",
    "estimators": "bench.estimators.__main__",
    "soak": "bench.soak.__main__",
    "fleet": "bench.fleet.__main__",
    "fleet_labels": "bench.fleet.labels",
    "labels": "bench.labels.__main__",
    "hostile_files": "bench.hostile.files",
    "hostile_serving": "bench.hostile.serving",
    "zoo": "bench.zoo.__main__",
    "fit_images": "bench.fit.images",
    "model_kinds": "bench.bench_model_kinds",
    "notebook_report": "bench.notebook_report",
    "lake": "bench.lake.__main__",
}
DEFAULT = ("oracle", "dscore")


def main(argv: list[str]) -> int:
    names = argv or list(DEFAULT)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    for name in names:
        print(f"== {name} ==", flush=True)
        module = importlib.import_module(BENCHMARKS[name])
        code = module.main([])
        if code:
            return int(code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
