"""The database schema and the reference profile: `db upgrade`, `db current`, `reference build`."""

from __future__ import annotations

import typer
from rich.table import Table

from monitor.cli.common import (
    Format,
    Services,
    err,
    fail,
    load_config,
    load_storage,
    open_database,
    open_store,
    out,
    render,
    some_services,
)
from monitor.cli.progress import progress

db_app = typer.Typer(no_args_is_help=True, help="Database schema: upgrade, current.")
reference_app = typer.Typer(no_args_is_help=True, help="The reference profile windows are compared with.")


@db_app.command("upgrade")
def db_upgrade(fmt: Format = "table") -> None:
    """Apply the schema migrations to the configured database (the config's `storage` alone is read)."""
    storage = load_storage()
    store = open_database(storage, check_schema=False)
    notes = store.upgrade(sql_role=storage.query_sql.role)
    record = {"database": store.current_revision(), "head": store.head_revision(), "warnings": notes}
    render([record], fmt, lambda: out.print(f"database at revision {record['database']} (head {record['head']})"),
           document=record)
    for note in notes if fmt == "table" else []:
        err.print(f"[yellow]warning:[/] {note}", highlight=False)


@db_app.command("current")
def db_current(fmt: Format = "table") -> None:
    """Show the database's schema revision and the one this tailwatch expects."""
    store = open_database(load_storage(), check_schema=False)
    if fmt != "table":
        record = {"database": store.current_revision(), "head": store.head_revision()}
        render([record], fmt, lambda: None, document=record)
        return
    out.print(f"database: {store.current_revision() or 'empty'}; this tailwatch: {store.head_revision()}")


@reference_app.command("build")
def reference_build(
    service: Services = None,
    fmt: Format = "table",
) -> None:
    """Profile each service's reference dataset (every one that has one), store the profile, and say what in
    it to fix."""
    from rich.markup import escape

    from checks.judge import judge
    from monitor.aggregate.profile import store_profile
    from monitor.cli.common import parse_now

    cfg = load_config()
    store = open_store(cfg)
    chosen = some_services(cfg, service)
    table = Table(title="reference profiles")
    for col in ("service", "rows", "fingerprint", "fields", "source"):
        table.add_column(col, justify="right" if col == "rows" else "left", overflow="fold",
                         no_wrap=col in ("service", "rows", "fingerprint"), min_width=8 if col == "fields" else None)
    concerns = Table(title="reference concerns: what to fix before trusting it")
    for col in ("service", "field", "concern", "seen", "suggested fix"):
        concerns.add_column(col, overflow="fold")
    built = []
    for svc in chosen:
        if svc.reference is None:
            err.print(f"[yellow]skipped:[/] service {escape(svc.name)} has no reference configured")
    todo = [s for s in chosen if s.reference is not None]
    profiled = []
    # A reference file is read whole: the rows profiled are known service by service, the total at the end.
    with progress("reference build") as observe:
        for svc in todo:
            try:
                profiled.append((svc, store_profile(store, svc)))
            except (OSError, ValueError) as exc:
                fail(f"service {svc.name}: cannot profile {svc.reference.path}: {exc}")
            if observe is not None:
                rows = sum(p.rows for _, p in profiled)
                observe(rows, rows if len(profiled) == len(todo) else None)
    warned = []
    for svc, profile in profiled:
        found = judge(profile, svc.check_params())
        warnings = _config_warnings(svc, profile, cfg.limits, parse_now(None))
        warned += [f"service {svc.name}: {w}" for w in warnings]
        built.append({"service": svc.name, "rows": profile.rows, "fields": list(profile.fields),
                      "fingerprint": profile.fingerprint, "source": str(svc.reference.path),
                      "concerns": [c.as_dict() for c in found], "warnings": warnings})
        table.add_row(escape(svc.name), f"{profile.rows:,}", profile.fingerprint, escape(", ".join(profile.fields)),
                      escape(str(svc.reference.path)))
        for c in found:
            concerns.add_row(escape(svc.name), escape(c.field or "(reference)"), c.kind, escape(c.detail),
                             escape(c.fix))
    if fmt != "table":
        render(built, fmt, lambda: None)
        return
    if table.row_count:  # no reference configured: the skipped line says so, an empty table says nothing
        out.print(table)
    if concerns.row_count:
        out.print(concerns)
    for line in warned:
        err.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)


def _config_warnings(service, profile, limits, now) -> list[str]:
    """What the config names that no reference row holds, and the categorical values the first rows of the
    logs write otherwise than the reference (none when the logs cannot be read yet)."""
    from monitor.aggregate.profile import read_reference
    from monitor.ingest.labels import unmatched
    from monitor.ingest.sample import log_rows, respelled_warnings

    q = service.quality
    matched = service.schema_.segments or service.schema_.classes or (q is not None and (q.groups or q.rules))
    reference = read_reference(service.reference, service.schema_.fold_case) if matched else None
    out = unmatched(reference, service, "the reference") if matched else []
    try:
        rows = log_rows(service, limits, now)
    except (OSError, ValueError):
        rows = None
    return out + respelled_warnings(profile, service.schema_, rows)
