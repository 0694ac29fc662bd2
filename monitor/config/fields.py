"""The building blocks of the config: its error, durations, paths relative to the config file, secrets,
and the checks of zones, cron expressions, database URLs and group expressions."""

from __future__ import annotations

import ast
import os
import re
import stat
from datetime import UTC, timedelta
from pathlib import Path
from typing import Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.cron import CronTrigger
from pydantic import BeforeValidator, ValidationInfo, model_validator

from monitor.classes import class_name
from monitor.durations import parse_duration
from monitor.schema import StrictModel
from storage.url import parse_url


class ConfigError(Exception):
    """A config that cannot be used; the message names the field path and the bad value."""


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


def base_dir(info: ValidationInfo) -> Path:
    """The directory of the config file being validated (relative paths start there)."""
    return Path((info.context or {}).get("base_dir", "."))


def resolve_path(value: Any, info: ValidationInfo) -> Path:
    """`value` as a path; a relative one is relative to the config file's directory."""
    path = Path(value)
    return path if path.is_absolute() else base_dir(info) / path


def existing_dir(value: Any, info: ValidationInfo) -> Path:
    if not resolve_path(value, info).is_dir():
        raise ValueError(f"directory does not exist: {value}")
    return resolve_path(value, info)


def existing_file(value: Any, info: ValidationInfo) -> Path:
    if not resolve_path(value, info).is_file():
        raise ValueError(f"file does not exist: {value}")
    return resolve_path(value, info)


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SECRET_HOW = "give {env: VARIABLE_NAME} or {file: /path/to/file} holding it"


class Secret(StrictModel):
    """Where a secret comes from: an environment variable's name or a file's path, never the value."""

    env: str | None = None
    file: Path | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_inline(cls, raw: Any) -> Any:
        # Whatever was written in place of {env: ...} or {file: ...} may be the secret itself: never quoted.
        if isinstance(raw, Secret):
            return raw
        if not isinstance(raw, dict):
            raise ValueError(f"a secret is never written in the config (not shown here); {SECRET_HOW}")
        if not set(raw) <= {"env", "file"}:
            raise ValueError("a secret takes only env (a variable name) or file (a path); the other keys are not "
                             f"shown here, as one may be the secret itself; {SECRET_HOW}")
        if isinstance(raw.get("env"), str) and not ENV_NAME.fullmatch(raw["env"]):
            raise ValueError("env: not an environment variable name (letters, digits and _; not shown here: it "
                             f"may be the secret itself); {SECRET_HOW}")
        return raw

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
        """Complaints about how the secret file is kept: writable by group or others, owned by another user
        (who may replace it), or a file of this user readable by group or others. A file on a read-only
        mount that root or another user owns is an orchestrator's mounted secret (a Kubernetes Secret with
        fsGroup, a compose secret): nobody here can change it, and it is not this user's to chmod."""
        if self.file is None or not self.file.exists():
            return []
        st = self.file.stat()
        out = []
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            out.append(f"secret file {self.file} is writable by group or others, who could replace the secret; "
                       "chmod go-w it")
        if st.st_uid == os.getuid():
            if st.st_mode & (stat.S_IRGRP | stat.S_IROTH):
                out.append(f"secret file {self.file} is readable by group or others; chmod 600 it")
        elif st.st_uid != 0 and not _read_only(self.file):
            out.append(f"secret file {self.file} is owned by uid {st.st_uid}, not by this process's user "
                       f"(uid {os.getuid()}), who could replace the secret; chown it to uid {os.getuid()}")
        return out


def _read_only(path: Path) -> bool:
    """Whether `path` lies on a file system mounted read-only (False when that cannot be told)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def hide_credentials(text: str) -> str:
    """`text` with the credentials of every URL in it replaced by ***: the password of a database URL
    (`user:***@`), the whole user part of an http(s) URL (its user alone may be a token)."""
    def hide(m: re.Match) -> str:
        scheme, user = m.group(1), m.group(2)
        if scheme.lower() in ("http", "https"):
            return f"{scheme}://***@"
        return f"{scheme}://{user.split(':', 1)[0]}:***@" if ":" in user else m.group(0)
    return _URL_USER.sub(hide, text)


def http_url(url: str) -> str:
    """`url` when it is an http(s) URL without credentials in it; ValueError otherwise (the credentials
    shown as ***): a URL in the config is printed back in errors, logs and the tick report, a secret is not."""
    if not url.startswith(("http://", "https://")) or "@" in url.split("/")[2]:
        raise ValueError(f"not an http(s) URL without credentials: {hide_credentials(url)!r}")
    return url


# Up to the last @ of the URL: a password written unquoted may hold / ? # or @ itself.
_URL_USER = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^\s'\"]*)@")


def value_maps(raw: Any) -> Any:
    """A `values:` section ({field: {written: meant}}) with each written value and each target named as the
    logs' values are (monitor.classes: `200` and `"200"` one key, `True` is `true`); a null target means
    missing. ValueError for a key that names nothing or two keys naming one value."""
    if not isinstance(raw, dict):
        return raw
    out: dict[str, dict[str, str | None]] = {}
    for field, mapping in raw.items():
        if not isinstance(mapping, dict):
            raise ValueError(f"{field}: a map of written value -> value meant, e.g. {{finished: ok}} "
                             f"(got {mapping!r:.60})")
        named: dict[str, str | None] = {}
        for written, meant in mapping.items():
            for value in (written, meant):
                if value is not None and not isinstance(value, str | int | float | bool):
                    raise ValueError(f"{field}: {value!r:.60} is not a single value")
            key = class_name(written)
            if key is None:
                raise ValueError(f"{field}: an empty value as a key ({written!r})")
            if key in named:
                raise ValueError(f"{field}: {written!r} and another key name the same value {key!r}")
            named[key] = class_name(meant)
        out[str(field)] = named
    return out


def check_zone(value: str | None) -> str | None:
    """An IANA zone name (`Europe/Paris`, `UTC`), checked against the zone database."""
    if value is None:
        return None
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {value!r} (an IANA name such as 'Europe/Paris' or 'UTC')") from None
    return value


def check_cron(expr: str) -> None:
    """Raise ValueError unless `expr` is a 5-field crontab expression APScheduler accepts."""
    if len(expr.split()) != 5:
        raise ValueError(f"not a 5-field cron expression (minute hour day month weekday): {expr!r}")
    try:
        CronTrigger.from_crontab(expr, timezone=UTC)
    except ValueError as exc:
        raise ValueError(f"not a valid cron expression {expr!r}: {exc}") from None


def check_url(value: str) -> str:
    """`value` when it is a database URL without an inline password; ValueError otherwise (never quoting
    a password: the URL is not shown when it cannot be parsed)."""
    try:
        url = parse_url(value)
    except Exception:
        raise ValueError("not a database URL such as postgresql+psycopg://tailwatch@db:5432/tailwatch (not "
                         "shown here: it may hold a password)") from None
    if url.password:
        raise ValueError(
            f"inline password in {url.render_as_string(hide_password=True)}; use a `password:` with env or file"
        )
    # libpq reads a password from the query string too (…/db?password=…).
    inline = sorted(k for k in url.query if k.lower() in ("password", "sslpassword"))
    if inline:
        raise ValueError(f"inline password in the URL's query ({', '.join(inline)}=…, not shown); use a "
                         "`password:` with env or file")
    return value


def expression_columns(expression: str) -> set[str]:
    """The column names a group expression (`tenure < 12 and Contract == 'One year'`) reads; ValueError
    for anything beyond comparisons of columns with constants (no calls, attributes or `@` variables)."""
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
