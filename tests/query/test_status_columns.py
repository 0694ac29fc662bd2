"""`query metrics` (history.metrics) and `compare` count and rate every status of the contract: the cancelled
and truncated requests of a generation service whose `values:` map its own words onto them, and no such
columns for a service that never logs either."""

from __future__ import annotations

import json
from datetime import timedelta

import pandas as pd
import pytest
from statuses_support import END, ONSET, START, fill
from typer.testing import CliRunner

from monitor.cli import app
from monitor.investigate import history
from monitor.investigate.compare import compare
from storage.store import Store

LOGGED_COLUMNS = {"cancelled", "truncated", "cancelled_rate", "truncated_rate"}


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> dict:
    return fill(tmp_path_factory.mktemp("statuses"))


@pytest.fixture
def store(stored):
    st = Store(stored["config"].storage.url)
    try:
        yield st
    finally:
        st.dispose()


def _expected(rows: pd.DataFrame, status: str) -> tuple[int, float]:
    n = int((rows["status"] == status).sum())
    return n, n / len(rows)


def test_metrics_count_and_rate_cancelled_and_truncated_where_logged(stored, store):
    gen = stored["rows"]["gen"]
    hours = history.metrics(store, "gen", since=START, until=END, every=timedelta(hours=1), group_by=())
    assert len(hours) == 2 and LOGGED_COLUMNS <= set(hours.columns)
    for (_, row), at in zip(hours.iterrows(), (START, ONSET), strict=True):
        part = gen[(gen["ts"] >= at) & (gen["ts"] < at + timedelta(hours=1))]
        for status in ("cancelled", "truncated"):
            count, rate = _expected(part, status)
            assert row[status] == count and row[f"{status}_rate"] == pytest.approx(rate)
    # v1's hour held none: a count and a rate of 0, not a missing value; v2's held both.
    assert hours.loc[0, "cancelled"] == 0 and hours.loc[0, "cancelled_rate"] == 0.0
    assert hours.loc[1, "cancelled"] > 0 and hours.loc[1, "truncated"] > 0
    # Beside the other statuses' columns, in the contract's order.
    columns = list(hours.columns)
    assert columns.index("error") + 1 == columns.index("cancelled")
    assert columns.index("reject_rate") + 1 == columns.index("cancelled_rate")
    # Where no row holds either (v1's hour alone; a service that never logs them): no such columns.
    v1 = history.metrics(store, "gen", since=START, until=ONSET, group_by=())
    churn = history.metrics(store, "churn", since=START, until=END, every=timedelta(hours=1), group_by=())
    assert v1["requests"].sum() > 0 and churn["requests"].sum() > 0
    assert not LOGGED_COLUMNS & (set(v1.columns) | set(churn.columns))
    assert {"timeout", "timeout_rate", "reject_rate", "error_rate"} <= set(churn.columns)


def test_compare_shows_cancelled_and_truncated_when_either_version_logs_them(stored, store):
    gen = stored["rows"]["gen"]
    [gen_svc, churn_svc] = stored["config"].services
    table = compare(store, gen_svc, "v1", "v2", START, END).table.set_index("metric")
    v2 = gen[gen["model_version"] == "v2"]
    for status in ("cancelled", "truncated"):
        count, rate = _expected(v2, status)
        # v1 logged none: 0, so the difference says how many more v2 had.
        assert table.loc[status, ["unit", "baseline", "candidate"]].tolist() == ["count", 0, count]
        assert table.loc[f"{status}_rate", "unit"] == "share"
        assert table.loc[f"{status}_rate", "baseline"] == 0.0
        assert table.loc[f"{status}_rate", "candidate"] == pytest.approx(rate)
        assert table.loc[f"{status}_rate", "difference"] == pytest.approx(rate)
    names = list(table.index)
    assert names.index("reject_rate") < names.index("cancelled_rate") < names.index("timeout")
    # A failure is the service's: error, timeout or reject; a cancelled or truncated request is not one.
    failed = v2["status"].isin(["error", "timeout", "rejected"]).mean()
    assert table.loc["failure_rate", "candidate"] == pytest.approx(failed)
    assert failed < 1 - (v2["status"] == "ok").mean()
    plain = compare(store, churn_svc, "v1", "v2", START, END).table
    assert not LOGGED_COLUMNS & set(plain["metric"]) and "timeout_rate" in set(plain["metric"])


def test_cli_query_metrics_and_compare_print_them(stored):
    path = str(stored["root"] / "tailwatch.yaml")
    span = ["--since", f"{START:%Y-%m-%dT%H:%M:%SZ}", "--until", f"{END:%Y-%m-%dT%H:%M:%SZ}"]

    def cli(*args):
        res = CliRunner().invoke(app, ["--config", path, *args], catch_exceptions=False,
                                 env={"COLUMNS": "250", "NO_COLOR": "1"})
        assert res.exit_code == 0, res.output
        return res.stdout

    gen = stored["rows"]["gen"]
    count, rate = _expected(gen[gen["ts"] >= ONSET], "cancelled")
    rows = json.loads(cli("query", "metrics", "-s", "gen", *span, "--every", "1h", "--format", "json"))
    assert [r["cancelled"] for r in rows] == [0, count] and rows[1]["cancelled_rate"] == pytest.approx(rate)
    table = cli("query", "metrics", "-s", "gen", *span, "--every", "1h")
    assert any("cancelled_rate" in line and "truncated_rate" in line for line in table.splitlines())
    assert "cancelled" not in cli("query", "metrics", "-s", "churn", *span, "--every", "1h", "--format", "csv")
    shown = cli("compare", "-s", "gen", "--baseline", "v1", "--candidate", "v2", *span)
    assert any("cancelled_rate" in line and f"{rate * 100:+.2f} pp" in line for line in shown.splitlines())
