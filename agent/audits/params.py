"""Parameter and schedule models of the robustness audits.

The parameter models (:class:`DScoreParams`, :class:`MutationParams`, :class:`MetamorphicParams`)
are shared by the CLI (``icos-agent audit ...``) and the scheduler, so both validate the same way;
a job model (``DScoreJob`` ...) is a kind's parameters plus its schedule (:class:`_Schedule`).
The ``audits`` config section that holds them is built in :mod:`agent.audits.config`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agent.core.durations import parse_duration
from agent.core.scheduler import validate_cron
from agent.data.limits import DEFAULT_MAX_COLUMNS, DEFAULT_MAX_ROWS, DataLimits, LimitNames

MUTATION_OPERATORS: tuple[str, ...] = ("DEC", "IMP", "SGN", "DIG")


def _duration(text: str) -> float:
    return parse_duration(text)


class _Strict(BaseModel):
    """Unknown fields are errors; each field's docstring is its description (docs/configuration.md)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


# -- audit parameters ----------------------------------------------------------------------------
class CommonParams(_Strict):
    label_free: bool = False
    """ignore labels: accuracy means agreement with the model's own labels"""

    max_samples: int | None = Field(2000, ge=1)
    """use at most this many inputs (a seeded random subset); null = all"""

    batch_size: int = Field(256, ge=1, le=65536)
    """inputs per model call during the audit"""


class DScoreParams(CommonParams):
    """D-Score §IV: ``n × n`` regions, translation hyper-parameter ``t``."""

    n: int = Field(3, ge=1, le=16)
    """the grid is `n × n` regions (D-Score §IV)"""

    t: float = Field(5.0, gt=0)
    """translation hyper-parameter `t` (D-Score eq. 2)"""


#: Without an explicit ``k``, this share of the data's cells is mutated per repetition: a fixed count
#: (100 cells) is under 1 % of a 40,000-cell table, where every change reads as robustness.
DEFAULT_CELL_SHARE = 0.05


class MutationParams(CommonParams):
    """Data mutation §4: ``k`` mutated cells per repetition (by default ``cell_share`` of the data's
    cells, so the size scales with the table), operators DEC/IMP/SGN/DIG."""

    k: int | None = Field(None, ge=1)
    """cells mutated per repetition, split equally between the operators; null = `cell_share` of the cells"""

    cell_share: float = Field(DEFAULT_CELL_SHARE, gt=0, le=1)
    """share of the data's cells mutated per repetition when `k` is null (0 < share ≤ 1)"""

    repetitions: int = Field(5, ge=1, le=1000)
    """repetitions per operator (mean and std are reported)"""

    operators: list[str] = Field(default_factory=lambda: list(MUTATION_OPERATORS))
    """mutation operators among DEC, IMP, SGN, DIG"""

    seed: int = Field(0, ge=0)
    """seed of the mutations"""

    @field_validator("operators")
    @classmethod
    def _ops(cls, v: list[str]) -> list[str]:
        ops = [o.strip().upper() for o in v]
        bad = [o for o in ops if o not in MUTATION_OPERATORS]
        if bad or not ops:
            raise ValueError(f"unknown operator(s) {bad or ops}; choose from {', '.join(MUTATION_OPERATORS)}")
        if len(set(ops)) != len(ops):
            raise ValueError(f"operator listed twice: {ops}")
        return ops


class MetamorphicParams(CommonParams):
    """Metamorphic testing (LAMPION §3): transformations (by default those of each kind of input the
    model has, :data:`agent.audits.relations.DEFAULT_RELATIONS`), order of composition, seed."""

    transformations: list[str | dict[str, Any]] | None = None
    """transformations (names or `{name: ..., param: ...}`); null: shift, brightness, contrast, gaussian_noise, blur
    for images; scale, noise for tables"""

    order: int = Field(1, ge=1, le=4)
    """1: each transformation alone; higher: compositions of that many"""

    seed: int = Field(0, ge=0)
    """seed of the random transformation parameters"""

    allow_flips: bool = False
    """allow `hflip`/`vflip` (only when a flip keeps the label)"""

    max_compositions: int | None = Field(None, ge=1)
    """at most this many higher-order compositions (seeded choice)"""


# -- scheduling ----------------------------------------------------------------------------------
class AuditData(_Strict):
    """Where a scheduled audit gets its inputs.

    ``reference``: a labeled (or unlabeled) data file (``.npz`` x/y, CSV, Parquet). ``live``: the
    bounded reservoir sample of recent live inputs (label-free); the run is skipped while the
    reservoir holds fewer than ``min_samples`` inputs.
    """

    source: Literal["reference", "live"] = "reference"
    """`reference`: a data file; `live`: the reservoir of recent live inputs (label-free)"""

    path: Path | None = None
    """the data file (`.npz` x/y, CSV, Parquet) when `source` is `reference`"""

    label_column: str | None = None
    """label column of a CSV/Parquet file"""

    min_samples: int = Field(50, ge=1)
    """`live`: the run is skipped until the reservoir holds this many inputs"""

    @model_validator(mode="after")
    def _needs_path(self) -> AuditData:
        if self.source == "reference" and self.path is None:
            raise ValueError("path is required when source is reference")
        if self.source == "live" and self.path is not None:
            raise ValueError("path is only used when source is reference")
        return self


class AuditDataLimits(_Strict):
    """Bounds on the reference data files the audits read, checked before a file is decompressed or
    parsed (a file past one fails its audit with an error naming the setting). The data stays in the
    agent's memory between runs, so the byte bound is lower than the CLI's `--max-data-bytes` (2 GiB)."""

    max_bytes: int = Field(256 * 1024**2, ge=1)
    """bytes of data held from one reference file (arrays' declared sizes; a table's rows x columns x 8)"""

    max_rows: int = Field(DEFAULT_MAX_ROWS, ge=1)
    """samples or rows of a reference file"""

    max_columns: int = Field(DEFAULT_MAX_COLUMNS, ge=1)
    """columns of a CSV or Parquet reference file"""

    def limits(self) -> DataLimits:
        names = LimitNames(*(f"audits.data_limits.{f}" for f in ("max_bytes", "max_rows", "max_columns")))
        return DataLimits(self.max_bytes, self.max_rows, self.max_columns, names)


class _Schedule(_Strict):
    cron: str | None = None
    """run on this cron schedule (5 fields, UTC); exactly one of `cron` and `interval`"""

    interval: str | None = None
    """run every this long (`30m`, `6h`); exactly one of `cron` and `interval`"""

    time_budget: str = "10m"
    """past this the run stops at its next step with status `timeout`"""

    data: AuditData | None = None
    """this audit's data (default: `audits.reference`, else the live reservoir)"""

    mlflow: bool = True
    """log this audit's runs to MLflow"""

    @field_validator("interval", "time_budget")
    @classmethod
    def _durations(cls, v: str | None) -> str | None:
        if v is not None and _duration(v) <= 0:
            raise ValueError(f"{v!r} must be positive")
        return v

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str | None) -> str | None:
        if v is None:
            return v
        return validate_cron(v)

    @model_validator(mode="after")
    def _cron_xor_interval(self) -> _Schedule:
        if (self.cron is None) == (self.interval is None):
            raise ValueError("set exactly one of cron and interval")
        return self

    @property
    def interval_seconds(self) -> float | None:
        return None if self.interval is None else _duration(self.interval)

    @property
    def time_budget_seconds(self) -> float:
        return _duration(self.time_budget)


class DScoreJob(_Schedule, DScoreParams):
    """D-Score audit (``docs/audits.md``). Present = scheduled."""


class MutationJob(_Schedule, MutationParams):
    """Data-mutation audit (``docs/audits.md``). Present = scheduled."""


class MetamorphicJob(_Schedule, MetamorphicParams):
    """Metamorphic audit (``docs/audits.md``). Present = scheduled."""


class ReservoirConfig(_Strict):
    size: int = Field(1000, ge=0, le=1_000_000)
    """live inputs kept for label-free audits; 0 = off"""

    horizon: str = "1h"
    """the sample covers inputs of at most about this age"""

    max_sample_bytes: int = Field(64 * 1024, ge=1)
    """a live input whose text and dynamic-length rows (token ids) exceed this many bytes is not kept: the reservoir
    holds at most size x max_sample_bytes of them (fixed-shape numbers are not counted)"""

    @field_validator("horizon")
    @classmethod
    def _horizon(cls, v: str) -> str:
        if _duration(v) <= 0:
            raise ValueError(f"{v!r} must be positive")
        return v


class AuditMlflowConfig(_Strict):
    """Where audit runs go. ``tracking_uri`` null → ``sqlite:///<state_dir>/mlflow.db`` when a state
    directory is set, else audits are not logged. Unreachable → spooled in ``<state_dir>``."""

    enabled: bool = True
    """log audit runs to MLflow"""

    tracking_uri: str | None = None
    """null: `sqlite:///<state_dir>/mlflow.db` when a state directory is set, else no logging"""

    experiment: str = Field("icos-agent", min_length=1)
    """MLflow experiment of the audit runs"""
