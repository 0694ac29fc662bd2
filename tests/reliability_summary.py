"""The reliability summary: every test marked `reliability` reports what it tried through pytest user
properties (`rel_inputs`, `rel_rows`, `rel_faults`, `rel_crashes`, `rel_rows_lost`, `rel_duplicates`); this sums them
into one table at the end of the run (`make reliability`, `make test`).

A plugin that tests/conftest.py loads rather than a conftest of tests/reliability/: under pytest-xdist the
process that prints the summary collects nothing, so it loads only the top conftest, and the reports it
receives from the workers carry their user properties."""

from __future__ import annotations

from collections import defaultdict

COLUMNS = [("rel_inputs", "inputs tried"), ("rel_rows", "rows read"), ("rel_faults", "faults injected"), ("rel_crashes", "crashes survived"),
           ("rel_rows_lost", "rows lost"), ("rel_duplicates", "duplicates")]


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    groups: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    outcomes: dict[str, set[str]] = defaultdict(set)
    for reports in terminalreporter.stats.values():
        for report in reports:
            # The teardown report carries every property recorded, fixtures' finalizers included.
            if getattr(report, "when", None) not in ("call", "teardown"):
                continue
            group = report.nodeid.split("::")[0].removeprefix("tests/").removesuffix(".py")
            if report.failed:
                outcomes[group].add("failed")
            if report.when != "teardown":
                continue
            # A key recorded several times (once per hypothesis example, say) adds up.
            for key, value in getattr(report, "user_properties", ()):
                if key in dict(COLUMNS):
                    groups[group][key] += int(value)
    if not groups:
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tailwatch reliability summary")
    table.add_column("suite")
    for _, title in COLUMNS:
        table.add_column(title, justify="right")
    table.add_column("result")
    totals: dict[str, int] = defaultdict(int)
    for group in sorted(groups):
        row = groups[group]
        for key, _ in COLUMNS:
            totals[key] += row[key]
        result = "FAILED" if outcomes[group] else "ok"
        table.add_row(group, *(f"{row[key]:,}" for key, _ in COLUMNS), result)
    table.add_row("total", *(f"{totals[key]:,}" for key, _ in COLUMNS),
                  "LOSS" if totals["rel_rows_lost"] or totals["rel_duplicates"]
                  else "FAILED" if any(outcomes.values()) else "ok")
    Console(file=terminalreporter._tw, force_terminal=False, width=140).print(table)
