"""The one way a page is rendered, whether the server sends it or `tailwatch report` saves it: the Jinja2
environment (every value escaped) and `render`. A served page refers to the server's static files and
links to its other pages; a saved page inlines the stylesheet and scripts, and links to the served UI
when its address is known, else names the other pages as plain text."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd
import plotly
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

HERE = Path(__file__).parent
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
STATIC = {"ui.css": (HERE / "static" / "ui.css", "text/css"), "ui.js": (HERE / "static" / "ui.js", "text/javascript"),
          "plotly.min.js": (PLOTLY_JS, "text/javascript")}
# What would end an inline <script> or <style> element early: `<\/` reads the same inside a JS string,
# regular expression or comment, and CSS holds no such text outside a string.
_CLOSING = re.compile(r"</(script|style)", re.I)
DECIMALS = 6  # the most decimals a figure is written with
_SCIENTIFIC = re.compile(r"(?<![\w.-])-?\d+(?:\.\d+)?e[+-]\d+(?![\w.])", re.I)


def _utc(value: Any, seconds: bool = False) -> str:
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return "-"
    return f"{pd.Timestamp(value).tz_convert('UTC'):%Y-%m-%d %H:%M{':%S' if seconds else ''}} UTC"


def plain(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant digits in plain decimals, never in scientific notation: thousands
    separated, at most DECIMALS decimals (a smaller magnitude reads "< 0.000001")."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    magnitude = math.floor(math.log10(abs(value)))
    decimals = min(max(digits - 1 - magnitude, 0), DECIMALS)
    text = f"{value:,.{decimals}f}"
    if decimals and "." in text:
        text = text.rstrip("0").rstrip(".")
    if text.lstrip("-") in ("0", ""):
        return f"{'> -' if value < 0 else '< '}{10.0 ** -DECIMALS:.{DECIMALS}f}"
    return text


def _num(value: Any, unit: str = "", digits: int = 3) -> str:
    if value is None or isinstance(value, float) and pd.isna(value):
        return "-"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{plain(float(value), digits)}{' ' + unit if unit else ''}"
    return str(value)


def _prose(text: Any) -> str:
    """Stored text (a verdict's summary, why an incident resolved, what changed) with any number written in
    scientific notation (`3e-05`, `1.2e+03`) rewritten in plain decimals as the pages write figures."""
    if text is None:
        return ""
    return _SCIENTIFIC.sub(lambda m: plain(float(m.group(0))), str(text))


def _pct(value: Any) -> str:
    return "-" if value is None or pd.isna(value) else f"{100 * value:.1f} %"


@cache
def asset(name: str) -> Markup:
    """A static file's text (one of STATIC), safe to place inside a <script> or <style> element."""
    return Markup(_CLOSING.sub(r"<\\/\1", STATIC[name][0].read_text(encoding="utf-8")))


@cache
def environment() -> Environment:
    """The templates, with the filters they format with (`utc`, `num`, `pct`, `prose`); autoescaped."""
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True))
    env.filters.update(utc=_utc, num=_num, pct=_pct, prose=_prose)
    env.globals.update(asset=asset)
    return env


def served(path: str) -> str | None:
    """A page's address on the server itself: its path."""
    return path


def linker(url: Callable[[str], str | None]) -> Callable[..., Markup]:
    """`link(path, text, cls)` for the templates: an anchor to `url(path)`, or `text` alone when `url`
    gives None (a saved page with no served UI to link to)."""

    def link(path: str, text: Any, cls: str = "") -> Markup:
        href = url(path)
        attrs = Markup(' class="{}"').format(cls) if cls else Markup()
        if href is None:
            return Markup("<span{}>{}</span>").format(attrs, text)
        return Markup('<a href="{}"{}>{}</a>').format(href, attrs, text)

    return link


def render(name: str, context: dict[str, Any], *, inline: bool = False,
           url: Callable[[str], str | None] = served) -> str:
    """Template `name` over `context`. `inline`: the stylesheet and scripts written into the page (a file
    that fetches nothing); `url` maps a page's path (`/incidents/7`) to the address its links point at,
    None for plain text."""
    return environment().get_template(name).render(**context, inline=inline, link=linker(url))
