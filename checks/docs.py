"""docs/checks.md from the check catalog and checks/docs_template.md.

    python -m checks.docs            # write docs/checks.md
    python -m checks.docs --check    # exit 1 when docs/checks.md is not what the catalog makes
"""

from __future__ import annotations

import argparse
import inspect
import sys
import typing
from pathlib import Path

from checks.catalog import contracts
from checks.contract import Contract

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = Path(__file__).with_name("docs_template.md")
TARGET = ROOT / "docs" / "checks.md"
MARKER = "<!-- catalog -->"
HEADER = ("<!-- Made by `python -m checks.docs` from the check catalog (checks/catalog.py) and "
          "checks/docs_template.md: edit those, not this file. -->\n\n")
KINDS = {"window": "window partials", "quality": "prediction rows (labels, scores)", "rule": "merged partials"}


def _type(hint: typing.Any) -> str:
    """A parameter's type as a user reads it."""
    if typing.get_origin(hint) is typing.Literal:
        return " or ".join(f"`{v}`" for v in typing.get_args(hint))
    return {int: "integer", float: "number", bool: "true / false", str: "text"}.get(hint, str(hint))


def _default(value: typing.Any) -> str:
    return f"`{value}`" if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


def _text(doc: str) -> str:
    """A docstring as one Markdown paragraph per paragraph."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())


def _section(c: Contract) -> list[str]:
    out = [f"### `{c.name}`", "", f"Family `{c.family}`; measured on {KINDS[c.kind]}; unit: {c.unit}; "
           f"`min_n` {c.min_n} {c.n_of}; parameters in `{c.configured}`.", "", _text(c.doc), ""]
    params = c.parameters()
    if params:
        if c.params.__doc__:
            out += [_text(c.params.__doc__), ""]
        out += ["| parameter | type | bounds | default |", "|---|---|---|---|"]
        out += [f"| `{name}` | {_type(hint)} | {bound or ''} | {_default(default)} |"
                for name, hint, default, bound in params]
        out.append("")
    return out


def catalog() -> str:
    """The catalog part of docs/checks.md: one table of every check, then each check's parameters."""
    rows = contracts()
    order = {"window": 0, "quality": 1, "rule": 2}
    rows.sort(key=lambda c: (order[c.kind], c.family, c.name))
    out = ["## Catalog", "", "| check | family | measured on | unit | `min_n` (of) | parameters in |",
           "|---|---|---|---|---|---|"]
    out += [f"| [`{c.name}`](#{c.name}) | {c.family} | {KINDS[c.kind]} | {c.unit} | {c.min_n} {c.n_of} "
            f"| `{c.configured}` |" for c in rows]
    out.append("")
    for c in rows:
        out += _section(c)
    return "\n".join(out).rstrip() + "\n"


def render() -> str:
    """The whole of docs/checks.md."""
    template = TEMPLATE.read_text()
    if MARKER not in template:
        raise ValueError(f"{TEMPLATE} has no {MARKER} line")
    return HEADER + template.replace(MARKER, catalog().rstrip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m checks.docs", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/checks.md is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET.relative_to(ROOT)} is stale: run `python -m checks.docs`", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
