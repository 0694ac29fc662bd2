"""Logs shipped as logrotate ships them: the real binary rotates a live JSONL, CSV or Parquet log between
ticks (rename and create, compress, delaycompress, copytruncate) while rows keep being appended, before
and after each rotation. What is stored must equal what was written: no row lost, none counted twice.

Needs /usr/sbin/logrotate (tests/setup/debian.sh installs Debian's package when allowed): skipped
without it, failed under CI=true.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from tests_support import stored_rows, valid_row

from monitor import config as config_mod
from monitor.daemon.runner import tick
from storage.store import Store

pytestmark = pytest.mark.reliability

LOGROTATE = shutil.which("logrotate", path="/usr/sbin:/sbin:/usr/bin:/bin")
NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
COLUMNS = ["request_id", "ts", "model_version", "status", "tenure", "Contract", "latency_ms"]
PATTERNS = {
    "create": "create",
    "compress": "create\n    compress",
    "delaycompress": "create\n    compress\n    delaycompress",
    "copytruncate": "copytruncate\n    compress\n    delaycompress",
}
CYCLES = 4  # rotations per run, with ticks before and after each
BATCH = 150  # rows appended at a time


@pytest.fixture(scope="module")
def logrotate():
    if LOGROTATE is None:
        if os.environ.get("CI") == "true":
            pytest.fail("logrotate is not installed (tests/setup/debian.sh installs it)")
        pytest.skip("logrotate is not installed: run tests/setup/debian.sh (needs root or sudo)")
    return LOGROTATE


class Writer:
    """An application appending rows to `app.<fmt>` by name, as it does after logrotate's `create` or a
    truncation: JSON Lines and CSV append (CSV writes its header to a new or emptied file); Parquet
    rewrites the file in place (same inode) with every row it holds."""

    def __init__(self, root, fmt: str):
        self.path, self.fmt = root / f"app.{fmt}", fmt
        self.next = 0
        self.held: list[dict] = []  # Parquet: the rows of the current file

    def append(self, n: int) -> None:
        new = [valid_row(i) for i in range(self.next, self.next + n)]
        self.next += n
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        if self.fmt == "jsonl":
            with open(self.path, "a") as fh:
                fh.write("".join(json.dumps({c: r[c] for c in COLUMNS}) + "\n" for r in new))
        elif self.fmt == "csv":
            with open(self.path, "a") as fh:
                if fresh:
                    fh.write(",".join(COLUMNS) + "\n")
                fh.write("".join(",".join(str(r[c]) for c in COLUMNS) + "\n" for r in new))
        else:
            self.held = (new if fresh else self.held + new)
            frame = pd.DataFrame([{c: r[c] for c in COLUMNS} for r in self.held])
            # Opened for writing in place: logrotate's `create` gives a new inode, a rewrite keeps this one.
            with open(self.path, "r+b" if self.path.exists() else "wb") as fh:
                fh.truncate(0)
                frame.to_parquet(fh, index=False)


def rotate(binary: str, root, fmt: str, pattern: str) -> None:
    conf = root.parent / "logrotate.conf"
    conf.write_text(f"{root}/app.{fmt} {{\n    rotate 20\n    missingok\n    ifempty\n    {PATTERNS[pattern]}\n}}\n")
    conf.chmod(0o644)
    result = subprocess.run([binary, "-f", "-s", str(root.parent / "logrotate.state"), str(conf)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_logrotate_patterns_lose_and_repeat_nothing(tmp_path, logrotate, fmt, pattern, record_property):
    root = tmp_path / "logs"
    root.mkdir()
    cfg = config_mod.parse({
        "services": [{"name": "churn", "sources": {"predictions": {"kind": "files", "path": str(root),
                                                                   "pattern": f"app.{fmt}*"}},
                      "schema": {"features": {"tenure": "numeric", "Contract": "categorical"}},
                      "join": {"lateness": "0s"}}],
        "limits": {"chunk_bytes": 16 * 1024}})  # several chunks per file: offsets land inside files
    store = Store(f"sqlite:///{tmp_path / 'tw.db'}")
    store.upgrade()
    writer = Writer(root, fmt)
    reports = []
    minute = 0

    def run_tick():
        nonlocal minute
        [report] = tick(cfg, store, NOW + timedelta(minutes=minute))
        minute += 1
        assert report.status == "ok", report.error
        reports.append(report)

    try:
        for _ in range(CYCLES):
            writer.append(BATCH)
            run_tick()
            writer.append(BATCH)  # not read yet when the file is rotated
            rotate(logrotate, root, fmt, pattern)
            writer.append(BATCH)
            run_tick()
        run_tick()
        rotate(logrotate, root, fmt, pattern)  # the last rows' file rotated once more: nothing new
        run_tick()
        written = writer.next
        stored = stored_rows(store)
        quarantined = sum(sum(r.quarantined.values()) for r in reports)
        duplicates = sum(r.duplicates for r in reports)
        names = sorted(p.name for p in root.iterdir())
        assert any(n.endswith(".gz") for n in names) == (pattern != "create"), names
        assert quarantined == 0, [dict(r.quarantined) for r in reports]
        assert duplicates == 0
        assert stored == written, (stored, written, names, [r.events for r in reports])
    finally:
        store.dispose()
    record_property("rel_inputs", 1)
    record_property("rel_rows", written)
    record_property("rel_faults", CYCLES + 1)
    record_property("rel_rows_lost", max(0, written - stored))
    record_property("rel_duplicates", max(0, stored - written) + duplicates)
