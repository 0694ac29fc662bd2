"""The whole config: storage, contract limits, the services, and the process-wide settings of alerts and
Slack, the daemon and the scale-out engine."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from monitor.config.crosscheck import metrics_errors
from monitor.config.fields import Duration, Secret, base_dir, check_cron, check_url, http_url
from monitor.config.metrics import MetricsExport
from monitor.config.service import Service, SqlSource
from monitor.config.ui import Ui
from monitor.schema import StrictModel
from storage.url import parse_url


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
        value = check_url(value)
        # A relative SQLite path means relative to the config file, like every other path here.
        url = parse_url(value)
        if url.drivername.startswith("sqlite") and url.database and url.database != ":memory:":
            if not Path(url.database).is_absolute():
                value = url.set(database=str(base_dir(info) / url.database)).render_as_string(hide_password=False)
        return value

    def resolved_url(self):
        """The SQLAlchemy URL with the password filled in from its secret (never log this)."""
        url = parse_url(self.url)
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
    # A tick that quarantines more than this share of the rows it read says so (tick record, log, `tick`).
    max_quarantine_share: float = Field(0.5, ge=0, le=1)
    # A longer line is quarantined (oversize_line) as it streams past, never held whole.
    max_line_bytes: int = Field(1024 * 1024, gt=0)
    # Decompressed bytes read from one .gz file in one tick; the rest waits for the next tick.
    max_decompressed_bytes_per_tick: int = Field(1024 * 1024 * 1024, gt=0)
    # Per service, the distinct values folded under their own name; past a cap, a tick folds the rest into one
    # `<other>` bucket (counted, warned): a service runs a few versions at once (stable, canary, shadow),
    max_versions: int = Field(50, gt=0)
    # a request passes a handful of named stages (a trace of hundreds of span names is not a pipeline),
    max_stages: int = Field(32, gt=0)
    # and a segment column splits traffic into what a person reads on one page (per column).
    max_segment_values: int = Field(100, gt=0)


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
    lock_key: int = Field(0x7461696C, ge=-(2**63), le=2**63 - 1)  # not used: the leader lock belongs to the schema
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

    @field_validator("base_url")
    @classmethod
    def _http(cls, value: str) -> str:
        return http_url(value)

    @model_validator(mode="after")
    def _one_way(self) -> Slack:
        if self.token is not None and self.channel is None and not self.routes:
            raise ValueError("slack.token needs a channel (or routes)")
        return self


class BasicAuth(StrictModel):
    """HTTP basic auth: a user name and a password kept as a secret (env var or file)."""

    username: str
    password: Secret


class Alertmanager(StrictModel):
    """Alertmanager delivery: every alert is pushed to each of `urls` (an HA pair gets every alert) by
    `POST /api/v2/alerts`, and re-sent while it fires every `resend_interval` with an end 4 intervals
    ahead (as Prometheus does), so an Alertmanager that stops hearing of it resolves it itself."""

    urls: list[str] = Field(min_length=1)
    runbook_url: str | None = None  # annotation runbook_url; {alertname} {service} {model_version} {incident}
    timeout: Duration = timedelta(seconds=10)
    resend_interval: Duration = Field(timedelta(minutes=1), gt=timedelta(0))
    max_attempts: int = Field(50, gt=0)  # per outbox item, then it is marked failed
    basic_auth: BasicAuth | None = None
    bearer_token: Secret | None = None

    @field_validator("urls")
    @classmethod
    def _http(cls, value):
        return [http_url(url) for url in value]

    @field_validator("runbook_url")
    @classmethod
    def _runbook(cls, value: str | None) -> str | None:
        return None if value is None else http_url(value)

    @model_validator(mode="after")
    def _one_auth(self) -> Alertmanager:
        if self.basic_auth is not None and self.bearer_token is not None:
            raise ValueError("give basic_auth or bearer_token, not both")
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
    """`no_data`: no prediction logged in the last complete window, the newest tick quarantined more than
    `limits.max_quarantine_share` of its rows, or (with `quality`) no label at all for the newest quality
    window that ended `labels_after` ago."""

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
    alertmanager: Alertmanager | None = None


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
    metrics: MetricsExport = Field(default_factory=MetricsExport)
    ui: Ui = Field(default_factory=Ui)

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

    @model_validator(mode="after")
    def _metrics_names_declared(self) -> Config:
        fields = {f for s in self.services for f in s.schema_.features} if self.metrics.fields else set()
        unknown = sorted(set(self.metrics.fields) - fields)
        if unknown:
            raise ValueError(f"metrics.fields: {unknown} are not features of any service")
        problems = metrics_errors(self.metrics.groups, self.services)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def warnings(self) -> list[str]:
        secrets = [self.storage.password, self.storage.query_sql.password] + [
            src.password for svc in self.services for src in svc.sources.__dict__.values() if isinstance(src, SqlSource)
        ]
        # --- reliability and security: Slack and redacted secrets are checked too ---
        if self.alerts.slack is not None:
            secrets += [self.alerts.slack.token, self.alerts.slack.webhook_url]
        secrets += self.daemon.redact + [self.ui.silence_token]
        return ([w for s in secrets if s is not None for w in s.warnings()]
                + [f"services[{i}] ({svc.name}): {w}" for i, svc in enumerate(self.services) for w in svc.warnings()])
