"""One watched service's config: its sources, reference, bucketing, label quality, SLO rules and release
comparison. Relative paths are read relative to the config file's directory."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from checks.catalog import thresholds
from checks.rules import parse_objective
from monitor.classes import class_name
from monitor.config.crosscheck import cross_errors, cross_warnings, nearest
from monitor.config.feedback import Feedback
from monitor.config.fields import (
    Duration,
    Secret,
    check_url,
    check_zone,
    existing_dir,
    existing_file,
    expression_columns,
    value_maps,
)
from monitor.contract import FIELDS, RecordKind
from monitor.schema import Schema, StrictModel


def one_field_per_column(columns: dict[str, str]) -> dict[str, str]:
    """`columns` (field -> column) when no column is read as two fields; ValueError naming those that are."""
    names = list(columns.values())
    repeated = sorted({c for c in names if names.count(c) > 1})
    if repeated:
        raise ValueError(f"columns: {repeated} mapped to more than one field")
    return columns


class Timestamps(StrictModel):
    """How a source writes its times: numbers are epochs in `epoch_unit`; text is RFC 3339 / ISO 8601,
    or follows `format` (strptime directives; without `%z` the time is in the source's `timezone`, UTC
    when unset). Text that does not follow `format` is still read as RFC 3339."""

    epoch_unit: Literal["s", "ms", "us", "ns"] = "s"
    format: str | None = None

    @field_validator("format")
    @classmethod
    def _directives(cls, value: str | None) -> str | None:
        if value is not None and "%" not in value:
            raise ValueError(f"format {value!r} has no strptime directive (e.g. '%d/%m/%Y %H:%M:%S')")
        return value


class Respelled(StrictModel):
    """Names and spellings of a file of the user's own: `columns` (field: the file's column), `values`
    (field: {as written: meant})."""

    columns: dict[str, str] = Field(default_factory=dict)
    values: dict[str, dict[str, str | None]] = Field(default_factory=dict)

    @field_validator("values", mode="before")
    @classmethod
    def _value_names(cls, value: Any) -> Any:
        return value_maps(value)

    @field_validator("columns")
    @classmethod
    def _one_field_per_column(cls, value: dict[str, str]) -> dict[str, str]:
        return one_field_per_column(value)


class Shape(Respelled):
    """A source's logs in their own shape: `columns` maps contract field names to the source's column
    names (`{request_id: id, ts: timestamp}`); `values` maps the values a field is written with to the
    values meant (`{status: {finished: ok}}`, keyed by contract or schema name); `timestamps` says how
    times are written; `durations` is the unit of the duration fields (`duration_ms`, `latency_ms`,
    `ttft_ms`) as written."""

    timestamps: Timestamps = Field(default_factory=Timestamps)
    durations: Literal["ms", "s", "us"] = "ms"

    def check_fields(self, kind: RecordKind) -> None:
        """ValueError naming any key of `columns` that is not a contract field of `kind`, with the valid ones."""
        unknown = [name for name in self.columns if name not in FIELDS[kind]]
        if unknown:
            reversed_ = [f"{self.columns[name]}: {name}" for name in unknown if self.columns[name] in FIELDS[kind]]
            hint = f"; the contract field comes first: {', '.join(reversed_)}" if reversed_ else ""
            raise ValueError(f"columns: {', '.join(map(repr, unknown))} "
                             f"{'is not a contract field' if len(unknown) == 1 else 'are not contract fields'} "
                             f"of {kind.value} (valid: {', '.join(FIELDS[kind])}){hint}")


class FileSource(Shape):
    """A directory of growing JSONL / CSV / Parquet files (gzip for JSONL and CSV)."""

    kind: Literal["files"] = "files"
    path: Path
    pattern: str = "*"
    format: Literal["auto", "jsonl", "csv", "parquet", "otlp"] = "auto"
    # The zone of timestamps written without an offset; unset, such a timestamp is `wrong_type`.
    timezone: str | None = None
    # Follow links that lead out of `path` (links within it are read once, as the file they name).
    follow_links: bool = False

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        return check_zone(value)

    @field_validator("path", mode="before")
    @classmethod
    def _path_exists(cls, value: Any, info: ValidationInfo) -> Path:
        return existing_dir(value, info)


class SqlSource(Shape):
    """A SQL table read incrementally on a monotonic column (an id or an insertion time)."""

    kind: Literal["sql"]
    url: str
    password: Secret | None = None
    table: str
    cursor_column: str
    # The zone of timestamps written without an offset; unset, such a timestamp is `wrong_type`.
    timezone: str | None = None

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        return check_zone(value)

    @field_validator("url")
    @classmethod
    def _no_inline_password(cls, value: str) -> str:
        return check_url(value)


Source = Annotated[FileSource | SqlSource, Field(discriminator="kind")]


class Sources(StrictModel):
    predictions: Source
    timings: Source | None = None
    labels: Source | None = None

    @model_validator(mode="after")
    def _mapped_fields(self) -> Sources:
        for kind in (RecordKind.predictions, RecordKind.timings, RecordKind.labels):
            source = getattr(self, kind.value)
            if source is not None:
                try:
                    source.check_fields(kind)
                except ValueError as exc:
                    raise ValueError(f"{kind.value}.{exc}") from None
        return self


class Reference(Respelled):
    """The training or validation data: its file, its own column names for the schema's fields and the
    contract's `label` / `prediction` (`columns`, field first), its own spellings (`values`), and what data
    checks compare a window with."""

    path: Path
    # what data checks compare a window with: the reference, or accepted serving history (see docs/checks.md)
    compare_with: Literal["reference", "serving_history"] = "reference"
    # the accepted serving period [start, end) that serving-history comparisons merge; none: the trailing baseline
    accepted: tuple[datetime, datetime] | None = None

    @field_validator("accepted")
    @classmethod
    def _accepted_period(cls, value: tuple[datetime, datetime] | None) -> tuple[datetime, datetime] | None:
        if value is None:
            return None
        start, end = (t if t.tzinfo else t.replace(tzinfo=UTC) for t in value)
        if end <= start:
            raise ValueError(f"accepted: the period's end {end} is not after its start {start}")
        return start, end

    @field_validator("path", mode="before")
    @classmethod
    def _path_exists(cls, value: Any, info: ValidationInfo) -> Path:
        return existing_file(value, info)


class Buckets(StrictModel):
    size: Duration = timedelta(minutes=5)
    windows: list[Duration] = Field(default_factory=lambda: [timedelta(minutes=15), timedelta(hours=1), timedelta(days=1)])

    @model_validator(mode="after")
    def _windows_whole_buckets(self) -> Buckets:
        if self.size <= timedelta(0):
            raise ValueError(f"size must be positive: {self.size}")
        for window in self.windows:
            if window % self.size:
                raise ValueError(f"window {window} is not a whole number of buckets of {self.size}")
        return self


class Join(StrictModel):
    """How long a prediction waits for its stage timings (and timings for their prediction)."""

    lateness: Duration = timedelta(minutes=10)


class QualityRule(StrictModel):
    """One acceptance rule: `metric` of `class` in `group` drops by at most `max_drop` from its baseline,
    or stays at or above `min`; it breaches only when the drop is past the tolerance beyond the uncertainty
    of both the window's figure and its baseline's (see docs/quality.md)."""

    name: str | None = None
    metric: Literal["precision", "recall", "f1", "accuracy", "roc_auc", "pr_auc", "feedback_rate", "feedback_mean"]
    class_: str = Field("macro", alias="class")  # a class, `macro`, `weighted`, or `all` (accuracy, feedback)
    group: str = "all"  # a group name, `all`, or `*` (every group: "each key group stays above its floor")
    max_drop: float | None = Field(None, ge=0)
    min: float | None = None

    @field_validator("class_", mode="before")
    @classmethod
    def _class_name(cls, value: Any) -> Any:
        name = class_name(value) if isinstance(value, str | int | float) else None
        return value if name is None else name

    @model_validator(mode="after")
    def _one_tolerance(self) -> QualityRule:
        if (self.max_drop is None) == (self.min is None):
            raise ValueError("give exactly one of max_drop or min")
        return self


class Quality(StrictModel):
    """Delayed-label quality: how labels wait and mature, which groups are scored, and acceptance rules."""

    windows: list[Duration] = Field(default_factory=lambda: [timedelta(days=1)])
    label_horizon: Duration = timedelta(days=7)  # a label waits this long for its prediction, then quarantine
    maturity_horizon: Duration = timedelta(days=14)  # a window is scored this long after it ends ...
    coverage_threshold: float = Field(0.8, gt=0, le=1)  # ... or once this share of it is labelled
    min_n: int = Field(30, ge=1)  # fewer samples: status `insufficient`, never an alert
    groups: dict[str, str] = Field(default_factory=dict)  # name -> expression, e.g. {short_tenure: "tenure < 12"}
    length_buckets: dict[str, list[float]] = Field(default_factory=dict)  # text feature -> length edges (chars)
    accepted_version: str | None = None  # baseline of acceptance rules when it scored the same window
    failed_as_miss: bool = False  # labelled failed / timed-out / rejected requests count as wrong predictions
    rules: list[QualityRule] = Field(default_factory=list)
    # False discovery rate of acceptance breaches per `fdr_period` of each window length: a window's decisions
    # (versions x rules x classes x groups) are Benjamini-Hochberg adjusted at fdr_q x window / fdr_period.
    fdr_q: float = Field(0.05, gt=0, lt=1)
    fdr_period: Duration = timedelta(days=1)
    bootstrap_samples: int = Field(200, ge=20, le=5000)
    seed: int = 0
    calibration_bins: int = Field(10, ge=2, le=100)
    bias_tolerance: float = Field(0.05, ge=0, le=1)  # labelled-share gap between predicted classes flagged
    retention: Duration = timedelta(days=35)  # scored predictions and labels kept; nightly looks this far back
    tick_windows: int = Field(12, ge=1)  # newest windows per length a tick re-scores; nightly does them all
    feedback: Feedback | None = None  # labels are feedback (thumbs, scores), not classes: no prediction needed

    @model_validator(mode="after")
    def _feedback_rules(self) -> Quality:
        rules = Feedback.checked_rules(self.feedback, self.rules)
        return self if rules == self.rules else self.model_copy(update={"rules": rules})

    @field_validator("groups")
    @classmethod
    def _expressions(cls, value: dict[str, str]) -> dict[str, str]:
        for name, expression in value.items():
            if name in ("all", "*") or "=" in name:
                raise ValueError(f"group name {name!r} is reserved (all, *, or a segment's `column=value`)")
            expression_columns(expression)
        return value

    @field_validator("fdr_period")
    @classmethod
    def _period(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("fdr_period must be positive")
        return value

    @field_validator("length_buckets")
    @classmethod
    def _edges(cls, value: dict[str, list[float]]) -> dict[str, list[float]]:
        for name, edges in value.items():
            if not edges or list(edges) != sorted(set(edges)):
                raise ValueError(f"length_buckets.{name}: edges must be increasing and non-empty")
        return value


class Constraint(StrictModel):
    """A hard release constraint on one `tailwatch compare` metric (e.g. `total_p99_ms`, `error_rate`,
    `cost_per_1k`): an absolute `max` / `min`, and/or `max_ratio` of candidate to baseline."""

    metric: str
    max: float | None = None
    min: float | None = None
    max_ratio: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _some_bound(self) -> Constraint:
        if self.max is None and self.min is None and self.max_ratio is None:
            raise ValueError(f"constraint on {self.metric}: give max, min or max_ratio")
        return self


class Compare(StrictModel):
    """`tailwatch compare`: serving price per hour (per version where it differs) and the
    hard constraints a candidate must meet."""

    hourly_price: float | None = Field(None, ge=0)
    version_prices: dict[str, float] = Field(default_factory=dict)
    constraints: list[Constraint] = Field(default_factory=list)

    def price(self, version: str) -> float | None:
        """Hourly price of serving `version` (its own, else hourly_price; None when not configured)."""
        return self.version_prices.get(version, self.hourly_price)


# --- SLO rules ---


class BurnRate(StrictModel):
    """One multi-window burn-rate condition: the error budget burns at least `factor` times too fast over
    both the `long` and the `short` window (Google SRE workbook, 'multiwindow, multi-burn-rate')."""

    long: Duration
    short: Duration
    factor: float = Field(gt=0)


class SloRule(StrictModel):
    """An SLO rule: `slo` like "p95 total latency <= 100 ms" or "timeout rate <= 0.5%", checked on the
    last complete `window` (or, with `burn_rate`, on its long and short windows), alerting after `for`."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    slo: str
    severity: Literal["page", "warn", "info"] = "warn"
    window: Duration | None = None  # default: the service's smallest window
    for_: Duration = Field(timedelta(0), alias="for")
    keep_firing_for: Duration = timedelta(0)
    burn_rate: list[BurnRate] = Field(default_factory=list)
    min_n: int | None = Field(None, gt=0)  # requests below which the rule neither fires nor resolves
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("slo")
    @classmethod
    def _parses(cls, value: str) -> str:

        parse_objective(value)
        return value


class Service(StrictModel):
    """One watched model or service: its sources, schema, reference, bucketing, check thresholds, label
    quality, SLO rules and release comparison."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    sources: Sources
    schema_: Schema = Field(default_factory=Schema, alias="schema")
    reference: Reference | None = None
    buckets: Buckets = Field(default_factory=Buckets)
    join: Join = Field(default_factory=Join)
    # the service's request deadline: a request logged `status: timeout` without latency_ms counts in total
    # latency at it; None: such requests are left out of it, and the verdicts say how many were
    deadline: Duration | None = Field(None, gt=timedelta(0))
    # check name -> overrides of its threshold fields (checks/<family>.py; defaults are the class's)
    checks: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # the history that latency, cache and signal checks compare a window with
    baseline: Literal["trailing_24h", "same_hour_7d"] = "trailing_24h"
    # how far before the window that history ends: a lag keeps a slow drift from becoming its own baseline
    baseline_lag: Duration = Field(timedelta(0), ge=timedelta(0))
    # a new version is accepted (compared with its own history) this long after it first appeared, when no
    # incident is open on it; None: only accepted_versions and `tailwatch accept`
    soak: Duration | None = Field(None, gt=timedelta(0))
    quality: Quality | None = None  # delayed-label quality; None: labels are not scored
    rules: list[SloRule] = Field(default_factory=list)  # SLO rules
    # known-good versions: rollback targets, and the baseline a new version is compared with until accepted
    accepted_versions: list[str] = Field(default_factory=list)
    compare: Compare = Field(default_factory=Compare)  # `tailwatch compare`

    @field_validator("checks")
    @classmethod
    def _known_checks(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        thresholds(value)
        return value

    @property
    def deadline_ms(self) -> float | None:
        """The request deadline in ms, None when not configured."""
        return None if self.deadline is None else self.deadline / timedelta(milliseconds=1)

    def check_params(self) -> dict[str, Any]:
        """Check name -> its threshold object, for the checks this service overrides."""
        return thresholds(self.checks)

    @model_validator(mode="after")
    def _quality_columns(self) -> Service:
        if self.quality is None:
            return self
        texts = [f for f, k in self.schema_.features.items() if k == "text"]
        known = set(self.schema_.features) | set(self.schema_.segments) | {f"{t}_length" for t in texts}
        for name, expression in self.quality.groups.items():
            unknown = expression_columns(expression) - known
            if unknown:
                raise ValueError(f"quality.groups.{name}: {sorted(unknown)} not declared (use features, "
                                 f"segments or <text feature>_length: {sorted(known)})")
        bad = [t for t in self.quality.length_buckets if t not in texts]
        if bad:
            raise ValueError(f"quality.length_buckets: {bad} are not text features ({texts})")
        if self.sources.labels is None:
            raise ValueError("quality needs sources.labels")
        classes = self.schema_.classes
        if classes:
            rules = [r if class_name(r.class_, classes) == r.class_ else r.model_copy(
                update={"class_": class_name(r.class_, classes)}) for r in self.quality.rules]
            unknown = sorted({r.class_ for r in rules} - set(classes) - {"macro", "weighted", "all"})
            if unknown:
                names = [*classes, "macro", "weighted", "all"]
                raise ValueError(f"quality.rules: classes {unknown} are not among schema.classes {classes}"
                                 f"{nearest(unknown[0], names)}")
            if rules != self.quality.rules:
                return self.model_copy(update={"quality": self.quality.model_copy(update={"rules": rules})})
        return self

    @model_validator(mode="after")
    def _cross_checked(self) -> Service:
        """Names one section uses that another declares, and columns read twice (monitor.config.crosscheck)."""
        problems = cross_errors(self)
        if problems:
            raise ValueError("\n".join(problems))
        # A fold_case feature's values are compared in lower case: so are its map's keys.
        folded = set(self.schema_.fold_case)
        update = {}
        for kind in ("predictions", "reference"):
            shape = self.sources.predictions if kind == "predictions" else self.reference
            if shape is not None and folded & set(shape.values):
                values = {f: {k.lower(): v for k, v in m.items()} if f in folded else m for f, m in shape.values.items()}
                update[kind] = shape.model_copy(update={"values": values})
        if not update:
            return self
        sources = self.sources.model_copy(update={"predictions": update["predictions"]}) \
            if "predictions" in update else self.sources
        return self.model_copy(update={"sources": sources, "reference": update.get("reference", self.reference)})

    def warnings(self) -> list[str]:
        """What this service's config sets up that nothing reads (monitor.config.crosscheck)."""
        return cross_warnings(self)

