"""Configuration: one YAML file, validated by pydantic; secrets only by environment variable or file.

Relative paths are read relative to the config file's directory. All durations accept `30s`, `5m`,
`1h`, `1d` or a number of seconds.
"""

from __future__ import annotations

import os
import re
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from sqlalchemy.engine import make_url

DEFAULT_PATH = "tailwatch.yaml"
ENV_CONFIG = "TAILWATCH_CONFIG"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


class ConfigError(Exception):
    """A config that cannot be used; the message names the field path and the bad value."""


def parse_duration(value: Any) -> timedelta:
    """`5m`, `1h`, `30s`, `1d`, `250ms` or seconds as a number -> timedelta."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"not a duration (use e.g. 30s, 5m, 1h, 1d): {value!r}")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


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


class Secret(_Model):
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


class FileSource(_Model):
    """A directory of growing JSONL / CSV / Parquet files (gzip for JSONL and CSV)."""

    kind: Literal["files"] = "files"
    path: Path
    pattern: str = "*"
    format: Literal["auto", "jsonl", "csv", "parquet", "otlp"] = "auto"

    @field_validator("path", mode="before")
    @classmethod
    def _path_exists(cls, value: Any, info: ValidationInfo) -> Path:
        return _existing_dir(value, info)


class SqlSource(_Model):
    """A SQL table read incrementally on a monotonic column (an id or an insertion time)."""

    kind: Literal["sql"]
    url: str
    password: Secret | None = None
    table: str
    cursor_column: str

    @field_validator("url")
    @classmethod
    def _no_inline_password(cls, value: str) -> str:
        return _check_url(value)


Source = Annotated[FileSource | SqlSource, Field(discriminator="kind")]


class Sources(_Model):
    predictions: Source
    timings: Source | None = None
    labels: Source | None = None


FeatureKind = Literal["numeric", "categorical", "text"]


class Schema(_Model):
    """What the prediction rows hold beyond the contract's own fields."""

    features: dict[str, FeatureKind] = Field(default_factory=dict)
    segments: list[str] = Field(default_factory=list)
    classes: list[str] = Field(default_factory=list)
    positive_class: str | None = None
    score_columns: dict[str, str] = Field(default_factory=dict)
    signals: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Schema:
        if self.positive_class is not None and self.positive_class not in self.classes:
            raise ValueError(f"positive_class {self.positive_class!r} is not one of classes {self.classes}")
        unknown = [c for c in self.score_columns if c not in self.classes]
        if unknown:
            raise ValueError(f"score_columns name classes not in classes: {unknown}")
        return self

    def score_column(self, cls: str) -> str:
        """The column holding the score of class `cls` (default `score_<class>`)."""
        return self.score_columns.get(cls, f"score_{cls}")


class Reference(_Model):
    path: Path

    @field_validator("path", mode="before")
    @classmethod
    def _path_exists(cls, value: Any, info: ValidationInfo) -> Path:
        return _existing_file(value, info)


class Buckets(_Model):
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


class Join(_Model):
    """How long a prediction waits for its stage timings (and timings for their prediction)."""

    lateness: Duration = timedelta(minutes=10)


class Service(_Model):
    """One watched model or service: its sources, schema, reference and bucketing."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    sources: Sources
    schema_: Schema = Field(default_factory=Schema, alias="schema")
    reference: Reference | None = None
    buckets: Buckets = Field(default_factory=Buckets)
    join: Join = Field(default_factory=Join)
    # --- per-service settings of later stages: checks (issue 4), quality (issue 5), rules (issue 6) ---


class Storage(_Model):
    url: str = Field("sqlite:///tailwatch.db", validate_default=True)
    password: Secret | None = None

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


class Limits(_Model):
    """Contract limits: rows past them are quarantined."""

    max_field_chars: int = Field(65536, gt=0)
    max_future: Duration = timedelta(minutes=10)
    min_ts: datetime = datetime(2000, 1, 1, tzinfo=UTC)
    chunk_rows: int = Field(500_000, gt=0)
    # Parsed and validated, a stretch of text takes ~8-10x its size in memory; 32 MiB parses as fast as
    # 128 MiB and keeps a tick's peak flat and well under 1 GiB whatever the backlog.
    chunk_bytes: int = Field(32 * 1024 * 1024, gt=0)


class Config(_Model):
    storage: Storage = Field(default_factory=Storage)
    limits: Limits = Field(default_factory=Limits)
    services: list[Service] = Field(min_length=1)
    # --- process-wide settings of later stages: alerts and Slack (issue 6), daemon (issue 7) ---

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
        secrets = [self.storage.password] + [
            src.password for svc in self.services for src in svc.sources.__dict__.values() if isinstance(src, SqlSource)
        ]
        return [w for s in secrets if s is not None for w in s.warnings()]


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
