"""Reading the config: one YAML file, validated by pydantic, with errors that name the field path and the
bad value. All durations accept `30s`, `5m`, `1h`, `1d` or a number of seconds."""

from __future__ import annotations

import difflib
import os
import re
import stat
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from monitor.config.fields import SECRET_HOW, ConfigError, Secret, hide_credentials
from monitor.config.model import Config, Storage

DEFAULT_PATH = "tailwatch.yaml"
ENV_CONFIG = "TAILWATCH_CONFIG"
_UNION_TAGS = ("files", "sql")
# A config is a few kilobytes: these bound what a hostile or mistaken file (a 100 MB file, /dev/zero, a
# "billion laughs" of nested aliases) can make the loader read, hold and validate.
MAX_CONFIG_BYTES = 1 << 20
MAX_ALIASES = 1000  # uses of anchors
MAX_NODES = 1_000_000  # values once every alias is expanded, as validation walks them


def _format_errors(exc: ValidationError, root: type[BaseModel] = Config) -> str:
    """The errors of `exc` a line each, named by their field path. A value is quoted only where it cannot
    be a secret: never inside a secret's section, and the credentials of any URL quoted are hidden."""
    lines = []
    for err in exc.errors():
        path = ""
        for part in err["loc"]:
            if part in _UNION_TAGS:
                continue  # pydantic puts the discriminated union's tag in the path; users never wrote it
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        msg = err["msg"].removeprefix("Value error, ")
        secret = _in_secret(root, err["loc"])
        # Custom messages already name the bad value; built-in ones get it appended.
        if err["type"] not in ("value_error", "missing"):
            msg += f" (not shown here: it may be the secret itself); {SECRET_HOW}" if secret else \
                f" (got {err.get('input')!r:.80})"
        if err["type"] == "extra_forbidden" and err["loc"]:
            known = _keys_at(root, err["loc"][:-1])
            close = difflib.get_close_matches(str(err["loc"][-1]), known, n=1, cutoff=0.6)
            msg += f"; did you mean {close[0]!r}?" if close else f"; known here: {', '.join(known)}"
        if err["type"] == "literal_error" and isinstance(err.get("input"), str) and not secret:
            # "Input should be 'precision', 'recall' or 'f1'": the choices, as pydantic quotes them
            choices = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
            close = difflib.get_close_matches(err["input"], choices, n=1, cutoff=0.6)
            msg += f"; did you mean {close[0]!r}?" if close else ""
        # A check across sections may find several things: each on its own line, under the same path.
        lines += [f"{path or 'config'}: {hide_credentials(line)}" for line in msg.split("\n")]
    return "\n".join(lines)


def _in_secret(root: type[BaseModel], loc: tuple) -> bool:
    """Whether the error location `loc` (below `root`) is a `Secret` or lies inside one."""
    kinds: list[Any] = [root]
    for part in loc:
        kinds = [t for kind in kinds for t in _step(kind, part)]
        if any(m is Secret for kind in kinds for m in _members(kind)):
            return True
    return False


def _keys_at(root: type[BaseModel], loc: tuple) -> list[str]:
    """The keys the section at `loc` (a pydantic error location, below `root`) accepts, as written, sorted."""
    kinds: list[Any] = [root]
    for part in loc:
        kinds = [t for kind in kinds for t in _step(kind, part)]
    return sorted({f.alias or name for kind in kinds for m in _members(kind)
                   if isinstance(m, type) and issubclass(m, BaseModel) for name, f in m.model_fields.items()})


def _members(kind: Any) -> list[Any]:
    """`kind` without its Annotated metadata, as the members of its union (`Quality | None`: Quality, None)."""
    origin = typing.get_origin(kind)
    if origin is typing.Annotated:
        return _members(typing.get_args(kind)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(kind) for m in _members(arg)]
    return [kind]


def _step(kind: Any, part: Any) -> list[Any]:
    """The types one step of an error location leads to from `kind`: a model's field, a list's item, a
    mapping's value, or the member of a union its tag names."""
    out = []
    for m in _members(kind):
        origin = typing.get_origin(m)
        if isinstance(m, type) and issubclass(m, BaseModel):
            if part in _UNION_TAGS:
                tag = m.model_fields.get("kind")
                out += [m] if tag is not None and part in typing.get_args(tag.annotation) else []
            else:
                field = m.model_fields.get(part) or next(
                    (f for f in m.model_fields.values() if f.alias == part), None)
                out += [field.annotation] if field is not None else []
        elif origin in (list, tuple) and isinstance(part, int):
            out += list(typing.get_args(m)[:1])
        elif origin is dict:
            out += list(typing.get_args(m)[1:2])
    return out


def load(path: str | os.PathLike | None = None) -> Config:
    """Read and validate the config at `path` (default $TAILWATCH_CONFIG, then ./tailwatch.yaml)."""
    path, raw = _read(path)
    return parse(raw, base_dir=path.parent)


def load_storage(path: str | os.PathLike | None = None) -> Storage:
    """Read the config at `path` (as `load`) and validate its `storage` section alone: what the schema
    commands need, before the services' log directories exist."""
    path, raw = _read(path)
    section = raw.get("storage", {}) if isinstance(raw, dict) else None
    try:
        return Storage.model_validate({} if section is None else section, context={"base_dir": path.parent})
    except ValidationError as exc:
        raise ConfigError("\n".join(f"storage.{line}" for line in _format_errors(exc, Storage).splitlines())) from None


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key written twice in one mapping (plain YAML keeps the last one
    silently: a feature or a section listed twice would lose its first entry)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
                seen.setdefault(key, line)
            except TypeError:  # an unhashable key: the base loader says so
                break
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is written twice in one mapping (lines {first} and {line}); "
                    "the second would silently replace the first", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases = getattr(self, "_aliases", 0) + 1
            if self._aliases > MAX_ALIASES:
                raise yaml.composer.ComposerError(None, None, f"more than {MAX_ALIASES:,} aliases",
                                                  self.peek_event().start_mark)
        return super().compose_node(parent, index)

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _expanded(node)
        return node


def _expanded(root: yaml.Node) -> int:
    """How many values `root` holds with every alias expanded (each node counted once per use, shared ones
    counted once and reused); a composer error past MAX_NODES or for an alias inside itself."""
    sizes: dict[int, int] = {}
    # Iterative, children before their parent: nesting as deep as the parser allows costs no recursion.
    todo: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_: set[int] = set()
    while todo:
        node, children_done = todo.pop()
        key = id(node)
        if key in sizes:
            continue
        children = ([n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode)
                    else node.value if isinstance(node, yaml.SequenceNode) else [])
        if not children_done:
            if key in open_:
                raise yaml.composer.ComposerError(None, None, "an alias refers to a value that holds it",
                                                  node.start_mark)
            open_.add(key)
            todo.append((node, True))
            todo += [(child, False) for child in children if id(child) not in sizes]
            continue
        open_.discard(key)
        sizes[key] = 1 + sum(sizes[id(child)] for child in children)
        if sizes[key] > MAX_NODES:
            raise yaml.composer.ComposerError(None, None, f"more than {MAX_NODES:,} values once its aliases "
                                              "are expanded", node.start_mark)
    return sizes[id(root)]


def safe_load(text: str) -> Any:
    """`text` as YAML (safe types only), a key written twice in one mapping an error; at most MAX_ALIASES
    aliases and MAX_NODES values with them expanded."""
    return yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 - a SafeLoader subclass


def _read(path: str | os.PathLike | None) -> tuple[Path, Any]:
    path = Path(path or os.environ.get(ENV_CONFIG) or DEFAULT_PATH)
    try:
        text = _bounded_text(path)
        return path, safe_load(text)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path} (create one with `tailwatch init`)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML: nested too deep") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong with the YAML and where (line, column), without the excerpt of the line PyYAML quotes:
    the broken line may be a secret written inline."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem is None:
        return type(exc).__name__
    where = exc.problem_mark or exc.context_mark
    at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
    return (f"{exc.context}: " if exc.context else "") + exc.problem + at


def _bounded_text(path: Path) -> str:
    """The text of the config file at `path`, at most MAX_CONFIG_BYTES; ConfigError for a device, a
    directory or a longer file (read no further than that)."""
    with open(path, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):  # a pipe: `--config <(...)`
            raise ConfigError(f"cannot read config file {path}: not a regular file")
        data = fh.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES:,} bytes: not a config")
    return data.decode("utf-8")


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
    return (Path(__file__).parents[1] / "templates" / "tailwatch.example.yaml").read_text(encoding="utf-8")
