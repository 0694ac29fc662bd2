"""`tailwatch check-logs`: what the configured sources hold, read from a sample, nothing written."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from monitor.cli.common import Format, fail, load_config, out, parse_now, render


def check_logs(
    service: Annotated[str | None, typer.Option("--service", "-s", help="Only this service (default: every one).")] = None,
    lines: Annotated[int, typer.Option(help="Rows read per source, at most (its oldest files first).", min=1)] = 1000,
    now: Annotated[str | None, typer.Option(help="The clock future timestamps are judged by (RFC 3339); default: now.")] = None,
    fmt: Format = "table",
) -> None:
    """Read a sample of each source as a tick would and say, per contract field, which column it is read
    from, an example and the shares missing or unreadable; per quarantine reason, the first offending field
    and line. Writes nothing; exits 1 when a source would accept no row, or the config asks of the logs what
    they do not hold (an error line says what)."""
    from monitor.ingest.sample import sample_service

    cfg = load_config()
    services = [s for s in cfg.services if service in (None, s.name)]
    if not services:
        fail(f"--service: no service {service!r} (configured: {', '.join(s.name for s in cfg.services)})")
    clock = parse_now(now)
    samples = [s for svc in services for s in sample_service(svc, cfg.limits, clock, lines)]
    render([s.as_dict() for s in samples], fmt, lambda: [print_sample(sample) for sample in samples])
    if not any(s.read for s in samples) or any(s.read and not s.accepted or s.errors for s in samples):
        raise typer.Exit(1)


def print_sample(sample, console: Console = out) -> None:
    """One source's sample as two tables: its fields (and what a time's or a duration's example is read as,
    so a wrong unit shows), then its quarantine reasons. Every value from the logs goes in as plain text
    (never markup)."""
    head = Text(f"{sample.service} {sample.source} ({sample.where}): {sample.read:,} rows read, "
                f"{sample.accepted:,} accepted, {sample.read - sample.accepted:,} quarantined",
                style="bold" if sample.accepted or not sample.read else "bold red")
    console.print(head, soft_wrap=True)  # one line, however long the path: it is grepped and copied
    fields = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for name, justify in (("field", "left"), ("column", "left"), ("example", "left"), ("missing", "right"),
                          ("unreadable", "right")):
        fields.add_column(name, justify=justify, overflow="fold", no_wrap=name in ("field", "column"))
    for f in sample.fields:
        column = Text(f.column if f.found else f"{f.column} (not found)", style="" if f.found else "red")
        fields.add_row(Text(f.field + (" *" if f.required else "")), column, Text(f.example or "-"),
                       f"{f.missing:.0%}", f"{f.unreadable:.0%}")
    console.print(fields)
    console.print(Text("* required", style="dim"))
    # Below the table, not in it: an instant in RFC 3339 would fold the examples of an 80-column terminal.
    for f in sample.fields:
        if f.read_as is not None:
            console.print(Text(f"{f.field}: {f.example} is read as {f.read_as}"))
    for line in sample.errors:
        console.print(Text("error: ", style="bold red") + Text(line))
    for line in sample.warnings:
        console.print(Text("warning: ", style="bold red") + Text(line))
    if sample.cursor is not None:
        console.print(Text(f"{sample.cursor}: the cursor column (read to know where the next read starts)"))
    if sample.unused:
        console.print(Text(f"columns no field is read from: {', '.join(sample.unused)} (a contract field's column: "
                           "map it under `columns:`; a feature, segment or signal: name it under `schema`)",
                           style="yellow"))
    if sample.reasons:
        reasons = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        for name in ("reason", "rows", "field", "first at", "line as written"):
            reasons.add_column(name, justify="right" if name == "rows" else "left", overflow="fold",
                               no_wrap=name in ("reason", "rows"))
        for r in sample.reasons:
            reasons.add_row(r.reason, f"{r.rows:,}", Text(r.field or "-"), Text(r.position), Text(r.line))
        console.print(reasons)
    console.print()
