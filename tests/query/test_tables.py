"""How query results read as tables: numbers with thousands separators (never e-notation), ids as written,
every column of a user's own SQL kept, and on a narrow terminal the last columns left out and named
rather than any cell cut or squeezed."""

from __future__ import annotations

import pandas as pd
from rich.console import Console

from monitor.investigate.output import by_severity, cell, table


def shown(frame, columns=None, width=80) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(table(frame, "t", columns, width=width))
    return console.export_text()


def test_cells_carry_thousands_separators_and_ids_stay_as_written():
    assert cell(22070) == "22,070" and cell(22070.4) == "22,070" and cell(0.001234) == "0.001234"
    assert cell(12345, whole=True) == "12345"
    text = shown(pd.DataFrame({"id": [12345], "requests": [1234567], "latency_ms": [22070.25]}))
    assert "12345" in text and "1,234,567" in text and "22,070" in text and "e+0" not in text


def test_an_all_null_column_is_kept_when_the_user_chose_the_columns():
    frame = pd.DataFrame({"id": [1, 2], "unset": [None, None]})
    assert "unset" in shown(frame)  # query sql: every column of the statement
    assert "unset" not in shown(frame, columns=["id", "unset"])  # a command's own pick


def test_a_narrow_table_leaves_out_its_last_columns_and_cuts_nothing():
    frame = pd.DataFrame({"window_start": pd.to_datetime(["2026-11-02T01:00:00Z"] * 2),
                          "check": ["cache_hit_rate", "latency"], "status": ["breach", "ok"],
                          "request_id": ["req-000000000001", "req-000000000002"],
                          "model_version": ["2026-11-release-candidate", "v1"], "extra": ["x", "y"]})
    text = shown(frame, width=70)
    assert "…" not in text and "req-000000000001" in text and "2026-11-02 01:00" in text
    assert "left out at this width: model_version, extra" in " ".join(text.split())
    assert all(len(line) <= 70 for line in text.splitlines())


def test_rows_by_severity_keep_their_time_order_within_a_rank():
    frame = pd.DataFrame({"status": ["ok", "breach", "insufficient", "breach"], "t": [1, 2, 3, 4]})
    ordered = by_severity(frame, "status", {"breach": 0, "insufficient": 1, "ok": 2})
    assert ordered["t"].tolist() == [2, 4, 3, 1]


def test_a_title_is_shown_as_written_never_read_as_markup():
    console = Console(width=80, record=True, color_system=None)
    console.print(table(pd.DataFrame({"id": [1]}), "findings of [bold]churn[/bold] by [red]"))
    # (folded to the table's width: compared without the spaces and line ends)
    assert "findingsof[bold]churn[/bold]by[red]" in "".join(console.export_text().split())


def test_a_time_is_kept_on_one_line_whatever_its_column_is_called():
    frame = pd.DataFrame({"request_id": ["tx-19010"], "ts": pd.to_datetime(["2026-12-07T01:27:09.531Z"]),
                          "note": ["a long note that may fold over several lines of the table"]})
    text = shown(frame, width=50)
    assert "2026-12-07 01:27:09.531" in text


def test_text_columns_are_narrowed_to_fit_never_past_the_terminal():
    # Explain's evidence on the demo: a long labels column beside short text columns with units. Left to
    # rich, labels was narrowed below its longest label, then widened back past the 80th column.
    frame = pd.DataFrame({
        "check": ["latency", "service_signal", "latency", "latency", "service_signal"],
        "labels": ["quantile=p95 stage=batch_wait", "signal=queue_depth", "quantile=p95 stage=total",
                   "bucket=<131 length=len:notes quantile=p95 stage=total", "signal=batch_size"],
        "value": ["45.2 ms", "0.664 requests", "50.9 ms", "49.9 ms", "2.34 requests"],
        "baseline": ["6.49 ms", "0.144 requests", "14.2 ms", "11.6 ms", "1.29 requests"],
        "change": ["7x", "4.6x", "3.6x", "4.3x", "1.8x"],
        "n": ["n=1,800 requests", "n=1,801 values", "n=1,801 requests", "n=938 requests", "n=1,362 values"],
        "interval": ["95% CI 43.8–46.5 ms", "", "95% CI 50.4–52.5 ms", "95% CI 48.4–50.4 ms", ""],
        "windows": [2, 2, 2, 2, 2]})
    for width in range(60, 141, 5):
        text = shown(frame, width=width)
        rows = [line.rstrip() for line in text.splitlines() if line[:1] in "┏┃┡│└"]
        # Whole: no line past the terminal, none cropped at its edge (each ends in the table's border).
        assert all(len(line) <= width and line[-1] in "┓┃┩│┘" for line in rows), (width, text)
        for label in ("quantile=p95", "stage=batch_wait", "signal=queue_depth", "length=len:notes"):
            assert label in text, (width, label)  # each label whole on its line
