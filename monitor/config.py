"""Configuration: one YAML file, validated by pydantic; secrets only by environment variable or file.

Relative paths are read relative to the config file's directory. All durations accept `30s`, `5m`,
`1h`, `1d` or a number of seconds.
"""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from apscheduler.triggers.cron import CronTrigger
from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from sqlalchemy.engine import make_url

from checks.catalog import thresholds
from checks.rules import parse_objective
from monitor.classes import class_name
from monitor.durations import parse_duration
from monitor.schema import Schema, StrictModel

DEFAULT_PATH = "tailwatch.yaml"
ENV_CONFIG = "TAILWATCH_CONFIG"



class ConfigError(Exception):
    """A config that cannot be used; the message names the field path and the bad value."""


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


def _base_dir(info: ValidationInfo) -> Path:
    return Path((info.context or {}).get("base_dir", "."))


def _resolve(value: Any, info: ValidationInfo) -> Path:
    path = Path(value)
    return path if path.is_absolute() else _base_dir(info) / path


def _existing_dir(value: Any, info: ValidationInfo) -> Path:
    if not _resolve(value, info).is_dir():
        raise ValueError(f"directory does not exist: {value}")
    return _resolve(value, info)


def _existing_file(value: Any, info: ValidationInfo) -> Path:
    if not _resolve(value, info).is_file():
        raise ValueError(f"file does not exist: {value}")
    return _resolve(value, info)


class Secret(StrictModel):
    """Where a secret comes from: an environment variable's name or a file's path, never the value."""

    env: str | None = None
    file: Path | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Secret:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env (a variable name) or file (a path)")
        return self

    def resolve(self) -> str:
        """The secret's value; raises ConfigError naming the variable or file, never the value."""
        if self.env is not None:
            value = os.environ.get(self.env)
            if value is None:
                raise ConfigError(f"environment variable {self.env} is not set")
            return value
        assert self.file is not None
        try:
            return self.file.read_text().rstrip("\r\n")
        except OSError as exc:
            raise ConfigError(f"cannot read secret file {self.file}: {exc.strerror}") from None

    def warnings(self) -> list[str]:
        """Complaints about how the secret is kept (a file readable by group or others)."""
        if self.file is not None and self.file.exists():
            mode = self.file.stat().st_mode
            if mode & (stat.S_IRGRP | stat.S_IROTH):
                return [f"secret file {self.file} is readable by group or others; chmod 600 it"]
        return []


def _check_zone(value: str | None) -> str | None:
    """An IANA zone name (`Europe/Paris`, `UTC`), checked against the zone database."""
    if value is None:
        return None
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {value!r} (an IANA name such as 'Europe/Paris' or 'UTC')") from None
    return value


class FileSource(StrictModel):
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
        return _check_zone(value)

    @field_validator("path", mode="before")
    @classmethod
    def _path_exists(cls, value: Any, info: ValidationInfo) -> Path:
        return _existing_dir(value, info)


class SqlSource(StrictModel):
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
        return _check_zone(value)

    @field_validator("url")
    @classmethod
    def _no_inline_password(cls, value: str) -> str:
        return _check_url(value)


Source = Annotated[FileSource | SqlSource, Field(discriminator="kind")]


class Sources(StrictModel):
    predictions: Source
    timings: Source | None = None
    labels: Source | None = None


class Reference(StrictModel):
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
        return _existing_file(value, info)


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


def expression_columns(expression: str) -> set[str]:
    """The column names a group expression (`tenure < 12 and Contract == 'One year'`) reads; ValueError
    for anything beyond comparisons of columns with constants (no calls, attributes or `@` variables)."""
    import ast

    # Syntax allowed: comparisons of declared columns with constants, joined by and/or/not/&/|.
    allowed = (ast.Expression, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.Name, ast.Constant, ast.Load,
               ast.And, ast.Or, ast.Not, ast.USub, ast.BinOp, ast.BitAnd, ast.BitOr, ast.List, ast.Tuple,
               ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq, ast.In, ast.NotIn)
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise ValueError(f"not an expression: {expression!r}") from None
    for node in ast.walk(tree):
        if not isinstance(node, allowed) or (isinstance(node, ast.BinOp)
                                                 and not isinstance(node.op, ast.BitAnd | ast.BitOr)):
            raise ValueError(f"group expression {expression!r} may only compare columns with constants "
                             f"(found {type(node).__name__})")
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


class QualityRule(StrictModel):
    """One acceptance rule: `metric` of `class` in `group` drops by at most `max_drop` from its baseline,
    or stays at or above `min`; it breaches only when the drop is past the tolerance beyond the uncertainty
    of both the window's figure and its baseline's (see docs/quality.md)."""

    name: str | None = None
    metric: Literal["precision", "recall", "f1", "accuracy", "roc_auc", "pr_auc"]
    class_: str = Field("macro", alias="class")  # a class, `macro`, `weighted`, or `all` (accuracy)
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
                raise ValueError(f"quality.rules: classes {unknown} are not among schema.classes {classes}")
            if rules != self.quality.rules:
                return self.model_copy(update={"quality": self.quality.model_copy(update={"rules": rules})})
        return self


class QuerySql(StrictModel):
    """How `tailwatch query sql` reaches the store. On PostgreSQL it connects as `role`, a role with SELECT
    on tailwatch's tables and nothing else (`tailwatch db upgrade` creates it and grants that; see
    docs/operations.md), and refuses a superuser or a role that can run server functions. `timeout`
    bounds one statement on either backend."""

    role: str = Field("tailwatch_reader", pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    password: Secret | None = None  # the role's password, when the server asks for one
    timeout: Duration = Field(timedelta(seconds=30), gt=timedelta(0))


class Storage(StrictModel):
    url: str = Field("sqlite:///tailwatch.db", validate_default=True)
    password: Secret | None = None
    query_sql: QuerySql = Field(default_factory=QuerySql)

    @field_validator("url")
    @classmethod
    def _no_inline_password(cls, value: str, info: ValidationInfo) -> str:
        value = _check_url(value)
        # A relative SQLite path means relative to the config file, like every other path here.
        url = make_url(value)
        if url.drivername.startswith("sqlite") and url.database and url.database != ":memory:":
            if not Path(url.database).is_absolute():
                value = url.set(database=str(_base_dir(info) / url.database)).render_as_string(hide_password=False)
        return value

    def resolved_url(self):
        """The SQLAlchemy URL with the password filled in from its secret (never log this)."""
        url = make_url(self.url)
        return url.set(password=self.password.resolve()) if self.password else url


class Limits(StrictModel):
    """Contract limits: rows past them are quarantined."""

    max_field_chars: int = Field(65536, gt=0)
    max_future: Duration = timedelta(minutes=10)
    min_ts: datetime = datetime(2000, 1, 1, tzinfo=UTC)
    chunk_rows: int = Field(500_000, gt=0)
    # Parsed and validated, a stretch of text takes ~8-10x its size in memory; 32 MiB parses as fast as
    # 128 MiB and keeps a tick's peak flat and well under 1 GiB whatever the backlog.
    chunk_bytes: int = Field(32 * 1024 * 1024, gt=0)


# --- daemon ---


class Health(StrictModel):
    """Where `/livez`, `/readyz` and `/metrics` listen; port null turns the server off."""

    host: str = "127.0.0.1"
    port: int | None = Field(9464, ge=0, le=65535)


class Tier(StrictModel):
    """Bucket partials older than `after` are merged into buckets of `bucket` (a whole multiple)."""

    after: Duration
    bucket: Duration


class Retention(StrictModel):
    """How long stored rows are kept; partials are compacted tier by tier, never dropped unless asked."""

    tiers: list[Tier] = Field(default_factory=lambda: [
        Tier(after=timedelta(days=14), bucket=timedelta(hours=1)),
        Tier(after=timedelta(days=90), bucket=timedelta(days=1)),
    ])
    partials: Duration | None = None  # drop partials older than this (null: keep the daily tier forever)
    quarantine: Duration = timedelta(days=30)
    outbox_sent: Duration = timedelta(days=14)
    ticks: Duration = timedelta(days=90)
    job_events: Duration = timedelta(days=30)

    @model_validator(mode="after")
    def _tiers_grow(self) -> Retention:
        for a, b in zip(self.tiers, self.tiers[1:], strict=False):
            if b.after <= a.after or b.bucket % a.bucket:
                raise ValueError(f"tiers must grow: {b.bucket} after {b.after} must follow {a.bucket} after "
                                 f"{a.after} with a later `after` and a whole multiple of its bucket")
        for t in self.tiers:
            if t.bucket <= timedelta(0) or timedelta(days=1) % t.bucket and t.bucket % timedelta(days=1):
                raise ValueError(f"tier bucket {t.bucket} must divide a day or be whole days")
        return self


class Daemon(StrictModel):
    """`tailwatch run`: schedule, leader lock, health server, shutdown bound, logs and retention."""

    interval: Duration = timedelta(minutes=1)  # between tick jobs
    nightly: str | None = "30 2 * * *"  # cron (UTC) of the nightly job; null when a CronJob runs it instead
    tick_misfire_grace: Duration = timedelta(seconds=30)
    nightly_misfire_grace: Duration = timedelta(hours=1)
    heartbeat_interval: Duration = timedelta(seconds=10)
    heartbeat_max_age: Duration = timedelta(minutes=2)  # /livez fails past this
    shutdown_timeout: Duration = timedelta(seconds=30)  # SIGTERM to exit, the running tick included
    lock_key: int = Field(0x7461696C, ge=-(2**63), le=2**63 - 1)  # PostgreSQL advisory lock id ("tail")
    lock_retry: Duration = timedelta(seconds=5)  # how often a follower tries for the lock
    leader_check: Duration = timedelta(seconds=5)  # how often the leader checks its lock connection
    health: Health = Field(default_factory=Health)
    log_format: Literal["json", "text"] = "json"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # Values kept out of logs and stored messages besides every other `Secret` of this config (which always are).
    redact: list[Secret] = Field(default_factory=list)
    retention: Retention = Field(default_factory=Retention)

    @field_validator("nightly")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is not None:
            check_cron(value)
        return value

    @model_validator(mode="after")
    def _positive(self) -> Daemon:
        for name in ("interval", "heartbeat_interval", "shutdown_timeout", "lock_retry", "leader_check"):
            if getattr(self, name) <= timedelta(0):
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.heartbeat_max_age <= self.heartbeat_interval:
            raise ValueError("heartbeat_max_age must exceed heartbeat_interval")
        return self


# --- alerts and Slack ---


class InhibitRule(StrictModel):
    """While an alert matching `source` fires, alerts matching `target` with the same values of the
    `equal` labels are muted (Alertmanager's inhibit_rules, exact matches)."""

    source: dict[str, str]
    target: dict[str, str]
    equal: list[str] = Field(default_factory=list)


class SlackRoute(StrictModel):
    """Send groups whose labels (severity included) match every pair of `match` to `channel`."""

    match: dict[str, str]
    channel: str


class Slack(StrictModel):
    """Slack delivery: a bot token (Web API: post, update in place, thread replies) or, as a post-only
    fallback, an incoming webhook URL. Both are secrets: env var or file only."""

    token: Secret | None = None
    webhook_url: Secret | None = None
    channel: str | None = None  # default channel (name or id)
    routes: list[SlackRoute] = Field(default_factory=list)
    base_url: str = "https://slack.com/api/"
    timeout: Duration = timedelta(seconds=10)
    max_attempts: int = Field(50, gt=0)  # per outbox item, then it is marked failed
    explain_command: str = "tailwatch explain {incident} --service {service}"  # {incident} {service} {model_version}

    @model_validator(mode="after")
    def _one_way(self) -> Slack:
        if self.token is not None and self.channel is None and not self.routes:
            raise ValueError("slack.token needs a channel (or routes)")
        return self


class VerdictAlerts(StrictModel):
    """How verdicts become alerts: ModelRegression (slower / worse / both) and InputDrift (drift). `for`
    is 0 by default: a verdict already weighs a whole window with each check's own significance test, and
    a new version is compared with its predecessor only until it has history of its own.

    A firing verdict alert resolves once `resolve_after` windows of the service's shortest length in a row
    are clear (healthy against the pre-incident baseline, or without the version's traffic). A slower
    verdict whose total latency rose by less than both `min_effect_ms` and `min_effect_ratio` is `info`;
    one that rests on serving signals only (cache hit rate, stale cache) with total latency flat is
    `serving_severity`; an SLO rule breach keeps `regression_severity`."""

    for_: Duration = Field(timedelta(0), alias="for")
    resolve_after: int = Field(2, ge=1)
    regression_severity: Literal["page", "warn", "info"] = "page"
    drift_severity: Literal["page", "warn", "info"] = "warn"
    min_effect_ms: float = Field(10.0, ge=0)
    min_effect_ratio: float = Field(0.1, ge=0)
    serving_severity: Literal["page", "warn", "info"] = "info"

    @model_validator(mode="before")
    @classmethod
    def _no_keep_firing_for(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and "keep_firing_for" in raw:
            raise ValueError("alerts.verdict.keep_firing_for is replaced by resolve_after: the number of clear "
                             "windows in a row (of the service's shortest window) before a verdict alert resolves")
        return raw


class NoDataAlerts(StrictModel):
    """`no_data`: no prediction logged in the last complete window, or (with `quality`) no label at all
    for the newest quality window that ended `labels_after` ago."""

    for_: Duration = Field(timedelta(minutes=30), alias="for")
    severity: Literal["page", "warn", "info"] = "page"
    labels_after: Duration = timedelta(days=2)
    labels_severity: Literal["page", "warn", "info"] = "warn"


def _default_inhibit() -> list[InhibitRule]:
    return [
        # A stale pipeline says nothing about the inputs: mute drift while no data arrives.
        InhibitRule(source={"alertname": "no_data"}, target={"alertname": "InputDrift"}, equal=["service"]),
        # A regression's message already names the input changes that came with it.
        InhibitRule(source={"alertname": "ModelRegression"}, target={"alertname": "InputDrift"},
                    equal=["service", "model_version"]),
    ]


class Alerts(StrictModel):
    """Alert grouping, timing, inhibition and delivery (Alertmanager semantics)."""

    group_by: list[str] = Field(default_factory=lambda: ["service", "model_version"])
    group_wait: Duration = timedelta(seconds=30)
    group_interval: Duration = timedelta(minutes=5)
    repeat_interval: Duration = timedelta(hours=4)
    verdict: VerdictAlerts = Field(default_factory=VerdictAlerts)
    no_data: NoDataAlerts = Field(default_factory=NoDataAlerts)
    # `error` fires when a source file could not be read in each of this many ticks in a row: one failed
    # read is retried next tick (a file mid-rotation), a file that stays unreadable is a broken pipeline.
    source_error_ticks: int = Field(3, ge=1)
    inhibit: list[InhibitRule] = Field(default_factory=_default_inhibit)
    slack: Slack | None = None


# --- scale-out engine ---


class Engine(StrictModel):
    """Where `tailwatch scan` folds a Parquet dataset into bucket partials (docs/scale.md)."""

    kind: Literal["local", "dask"] = "local"
    # A running Dask scheduler (tcp://host:8786, tls://...); null starts a LocalCluster for the scan.
    scheduler: str | None = Field(None, pattern=r"^(tcp|tls|ucx|inproc|ws|wss)://\S+$")
    n_workers: int = Field(2, gt=0)  # LocalCluster worker processes (one thread each); unused with `scheduler`
    partition_rows: int = Field(250_000, gt=0)  # rows folded at once: per local chunk, per slice of a partition


class Config(StrictModel):
    storage: Storage = Field(default_factory=Storage)
    limits: Limits = Field(default_factory=Limits)
    services: list[Service] = Field(min_length=1)
    # --- process-wide settings of later stages: alerts and Slack, daemon, engine ---
    alerts: Alerts = Field(default_factory=Alerts)
    daemon: Daemon = Field(default_factory=Daemon)
    engine: Engine = Field(default_factory=Engine)

    @model_validator(mode="before")
    @classmethod
    def _validate_default_storage(cls, raw: Any) -> Any:
        # Validated like a written one, so the default SQLite file sits beside the config file.
        return {"storage": {}} | raw if isinstance(raw, dict) else raw

    @field_validator("services")
    @classmethod
    def _unique_names(cls, value: list[Service]) -> list[Service]:
        names = [s.name for s in value]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"service names must be unique, repeated: {dupes}")
        return value

    def warnings(self) -> list[str]:
        secrets = [self.storage.password, self.storage.query_sql.password] + [
            src.password for svc in self.services for src in svc.sources.__dict__.values() if isinstance(src, SqlSource)
        ]
        # --- reliability and security: Slack and redacted secrets are checked too ---
        if self.alerts.slack is not None:
            secrets += [self.alerts.slack.token, self.alerts.slack.webhook_url]
        secrets += self.daemon.redact
        return [w for s in secrets if s is not None for w in s.warnings()]


def check_cron(expr: str) -> None:
    """Raise ValueError unless `expr` is a 5-field crontab expression APScheduler accepts."""
    if len(expr.split()) != 5:
        raise ValueError(f"not a 5-field cron expression (minute hour day month weekday): {expr!r}")
    try:
        CronTrigger.from_crontab(expr, timezone=UTC)
    except ValueError as exc:
        raise ValueError(f"not a valid cron expression {expr!r}: {exc}") from None


def _check_url(value: str) -> str:
    try:
        url = make_url(value)
    except Exception:
        raise ValueError(f"not a database URL: {value!r}") from None
    if url.password:
        raise ValueError(
            f"inline password in {url.render_as_string(hide_password=True)}; use a `password:` with env or file"
        )
    return value


_UNION_TAGS = ("files", "sql")


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        path = ""
        for part in err["loc"]:
            if part in _UNION_TAGS:
                continue  # pydantic puts the discriminated union's tag in the path; users never wrote it
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        msg = err["msg"].removeprefix("Value error, ")
        # Custom messages already name the bad value; built-in ones get it appended.
        if err["type"] not in ("value_error", "missing"):
            msg += f" (got {err.get('input')!r:.80})"
        lines.append(f"{path or 'config'}: {msg}")
    return "\n".join(lines)


def load(path: str | os.PathLike | None = None) -> Config:
    """Read and validate the config at `path` (default $TAILWATCH_CONFIG, then ./tailwatch.yaml)."""
    path = Path(path or os.environ.get(ENV_CONFIG) or DEFAULT_PATH)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path} (create one with `tailwatch init`)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse(raw, base_dir=path.parent)


def parse(raw: Any, base_dir: Path = Path(".")) -> Config:
    """Validate an already-loaded mapping; relative paths resolve against `base_dir`."""
    if not isinstance(raw, dict):
        raise ConfigError(f"config must be a mapping, got {type(raw).__name__}")
    try:
        return Config.model_validate(raw, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc)) from None


def example() -> str:
    """The commented example config that `tailwatch init` writes."""
    return (Path(__file__).parent / "templates" / "tailwatch.example.yaml").read_text(encoding="utf-8")
