"""Hostile lines through whole ticks: a line of 1 GiB, a gzip bomb, a line still being written past
`limits.max_line_bytes`. Memory follows the limits, not the line: each long line is quarantined once as
`oversize_line` with its length, and every other row, file and service is read.

The memory-bound cases tick in a child process under an address-space cap (`resource.setrlimit`), within a
subprocess timeout. Each test records what it tried as pytest user properties (`rel_inputs`, `rel_rows`,
`rel_rows_lost`), which `make reliability` sums into its summary table.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
import textwrap
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from tests_support import valid_lines

from monitor import config as config_mod
from monitor.daemon.runner import tick
from storage.store import Store

pytestmark = pytest.mark.reliability

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]
CAP = 1536 << 20  # the child's address space: far below a line of 1 GiB read whole and copied once
GIB = 1 << 30


def service(name: str, folder: Path) -> dict:
    return {"name": name, "sources": {"predictions": {"kind": "files", "path": str(folder)}},
            "schema": {"features": {"tenure": "numeric", "Contract": "categorical", "notes": "text"},
                       "segments": ["Contract"]},
            "join": {"lateness": "0s"}}


# The child: ticks the config given as JSON, prints per tick and service what it read and quarantined,
# then the oversize_line excerpts stored.
CHILD = textwrap.dedent("""
    import json, sys
    from datetime import datetime, timedelta
    from monitor import config as config_mod
    from monitor.daemon.runner import tick
    from storage.store import Store

    raw, db, now, ticks = json.loads(sys.argv[1]), sys.argv[2], datetime.fromisoformat(sys.argv[3]), int(sys.argv[4])
    cfg = config_mod.parse(raw)
    store = Store("sqlite:///" + db)
    store.upgrade()
    out = []
    for k in range(ticks):
        out.append([{"service": r.service, "status": r.status, "error": r.error, "read": r.read["predictions"],
                     "accepted": r.accepted["predictions"], "quarantined": dict(r.quarantined), "folded": r.folded}
                    for r in tick(cfg, store, now + timedelta(minutes=k))])
    with store.transaction() as s:
        excerpts = [q["excerpt"] for q in store.quarantine.search(s, "churn", reason="oversize_line")]
    print(json.dumps({"ticks": out, "excerpts": excerpts}))
""")


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def run_capped(raw: dict, tmp: Path, ticks: int, timeout: float = 300) -> dict:
    """`ticks` ticks over config `raw` in a child process capped at CAP bytes of address space."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(raw), str(tmp / "tw.db"), NOW.isoformat(),
                           str(ticks)], capture_output=True, text=True, timeout=timeout, preexec_fn=_cap, env=env,
                          cwd=tmp)
    assert done.returncode == 0, f"the capped tick failed ({done.returncode}): {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def by_service(result: dict) -> dict[str, dict]:
    """Per service, its counts summed over the ticks (quarantine by reason)."""
    totals: dict[str, dict] = {}
    for reports in result["ticks"]:
        for r in reports:
            assert r["status"] == "ok", r["error"]
            t = totals.setdefault(r["service"], {"read": 0, "accepted": 0, "folded": 0, "quarantined": {}})
            for key in ("read", "accepted", "folded"):
                t[key] += r[key]
            for reason, n in r["quarantined"].items():
                t["quarantined"][reason] = t["quarantined"].get(reason, 0) + n
    return totals


def test_a_line_of_one_gib_among_200_rows(tmp_path, record_property):
    logs, other = tmp_path / "p", tmp_path / "q"
    logs.mkdir()
    other.mkdir()
    with open(logs / "app.jsonl", "w") as fh:
        fh.write(valid_lines(100))
        fh.write('{"request_id": "huge", "notes": "')
        block = "x" * (64 << 20)
        for _ in range(GIB // len(block)):
            fh.write(block)
        fh.write('"}\n')
        fh.write(valid_lines(100, start=100))
    (logs / "next.jsonl").write_text(valid_lines(50, start=200))
    (other / "app.jsonl").write_text(valid_lines(80))
    raw = {"services": [service("churn", logs), service("other", other)]}
    try:
        result = run_capped(raw, tmp_path, ticks=2)
    finally:
        (logs / "app.jsonl").unlink()
    totals = by_service(result)
    churn = totals["churn"]
    assert churn["quarantined"] == {"oversize_line": 1}
    assert churn["accepted"] == churn["folded"] == 250
    assert totals["other"]["accepted"] == totals["other"]["folded"] == 80
    length = len('{"request_id": "huge", "notes": "') + GIB + len('"}')
    [quoted] = result["excerpts"]
    assert f"a line of {length:,} bytes" in quoted and '{"request_id": "huge"' in quoted
    # The second tick reads nothing again.
    assert all(r["read"] == 0 for r in result["ticks"][1])
    record_property("rel_inputs", 1)
    record_property("rel_rows", churn["read"] + totals["other"]["read"])
    record_property("rel_rows_lost", 251 - churn["read"] + 80 - totals["other"]["read"])


def write_bomb(path: Path, zeros: int, before: str = "") -> None:
    """A gzip file of `before` and then `zeros` zero bytes (no newline), as concatenated members: one
    member of 256 MiB of zeros is compressed once and written again and again (seconds, a few MB)."""
    member = 256 << 20
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    one = packer.compress(bytes(member)) + packer.flush()
    with open(path, "wb") as fh:
        fh.write(gzip.compress(before.encode()))
        for _ in range(zeros // member):
            fh.write(one)


def test_a_gzip_bomb_in_a_log_directory(tmp_path, record_property):
    logs, other = tmp_path / "p", tmp_path / "q"
    logs.mkdir()
    other.mkdir()
    bomb = logs / "app.jsonl.1.gz"
    write_bomb(bomb, 10 * GIB, before=valid_lines(40))
    assert bomb.stat().st_size < 20 << 20
    os.utime(bomb, (1, 1))  # the oldest file: read first
    (logs / "app.jsonl").write_text(valid_lines(60, start=40))
    (other / "app.jsonl").write_text(valid_lines(70))
    raw = {"services": [service("churn", logs), service("other", other)]}
    try:
        result = run_capped(raw, tmp_path, ticks=3)
    finally:
        bomb.unlink()
    totals = by_service(result)
    churn = totals["churn"]
    # The bomb's rows before its zeros, and every row of the other file and service, are read; its zeros
    # are one line, quarantined once (it has no end: its length so far), passed over a budget per tick.
    assert churn["quarantined"] == {"oversize_line": 1}
    assert churn["accepted"] == churn["folded"] == 100
    assert totals["other"]["accepted"] == totals["other"]["folded"] == 70
    [quoted] = result["excerpts"]
    assert "a line of at least" in quoted
    record_property("rel_inputs", 1)
    record_property("rel_rows", churn["read"] + totals["other"]["read"])
    record_property("rel_rows_lost", 101 - churn["read"] + 70 - totals["other"]["read"])


def test_a_gzip_file_is_read_a_budget_per_tick(tmp_path, record_property):
    """A compressed rotation longer than the tick's budget resumes where the last tick stopped."""
    logs = tmp_path / "p"
    logs.mkdir()
    body = valid_lines(3000).encode()
    (logs / "app.jsonl.1.gz").write_bytes(gzip.compress(body))
    budget = len(body) // 3 + 1
    cfg = config_mod.parse({"services": [service("churn", logs)],
                            "limits": {"max_decompressed_bytes_per_tick": budget, "chunk_bytes": 64 << 10}})
    store = Store(f"sqlite:///{tmp_path / 'tw.db'}")
    store.upgrade()
    reads = []
    for k in range(5):
        [report] = tick(cfg, store, NOW + timedelta(minutes=k))
        assert report.status == "ok", report.error
        reads.append(report.read["predictions"])
    store.dispose()
    assert sum(reads) == 3000 and reads[-1] == 0
    # No tick read more than its budget past where it started: a third of the file, give or take a line.
    assert max(reads) <= 1001 and len([n for n in reads if n]) in (3, 4)
    record_property("rel_inputs", 1)
    record_property("rel_rows", sum(reads))
    record_property("rel_rows_lost", 3000 - sum(reads))


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_long_line_within_a_chunk_is_oversize_line(tmp_path, record_property, fmt):
    """A line held in a chunk but longer than max_line_bytes is quarantined as one passed over would be."""
    logs = tmp_path / "p"
    logs.mkdir()
    if fmt == "jsonl":
        text = valid_lines(10) + json.dumps({"request_id": "long", "notes": "y" * 5000}) + "\n" + valid_lines(10, 10)
    else:
        rows = [json.loads(line) for line in valid_lines(20).splitlines()]
        head = list(rows[0])
        lines = [",".join(head)] + [",".join(str(r[c]) for c in head) for r in rows[:10]]
        lines += ["long," + "y" * 5000] + [",".join(str(r[c]) for c in head) for r in rows[10:]]
        text = "\n".join(lines) + "\n"
    (logs / f"app.{fmt}").write_text(text)
    if fmt == "jsonl":  # and in a file too large to be read with the small ones
        (logs / "big.jsonl").write_text(valid_lines(1000, 100) + text.replace("req-", "big-"))
    cfg = config_mod.parse({"services": [service("churn", logs)], "limits": {"max_line_bytes": 4096}})
    store = Store(f"sqlite:///{tmp_path / 'tw.db'}")
    store.upgrade()
    [report] = tick(cfg, store, NOW)
    assert report.status == "ok", report.error
    with store.transaction() as s:
        quoted = [q["excerpt"] for q in store.quarantine.search(s, "churn")]
    store.dispose()
    long = 2 if fmt == "jsonl" else 1
    assert report.quarantined == {"oversize_line": long}
    assert all("a line of 5,0" in q and "over limits.max_line_bytes (4,096)" in q for q in quoted), quoted
    assert report.accepted["predictions"] == report.read["predictions"] - long == (1040 if long == 2 else 20)
    record_property("rel_inputs", 1)
    record_property("rel_rows", report.read["predictions"])
    record_property("rel_rows_lost", report.read["predictions"] - report.accepted["predictions"] - long)


def test_a_long_line_still_being_written(tmp_path, record_property):
    """A line past max_line_bytes without its newline yet is quarantined once; the next tick passes over
    its rest and reads the rows after it."""
    logs = tmp_path / "p"
    logs.mkdir()
    live = logs / "app.jsonl"
    live.write_text(valid_lines(30) + '{"request_id": "endless", "notes": "' + "z" * 20_000)
    cfg = config_mod.parse({"services": [service("churn", logs)],
                            "limits": {"max_line_bytes": 4096, "chunk_bytes": 8192}})
    store = Store(f"sqlite:///{tmp_path / 'tw.db'}")
    store.upgrade()
    reports = []
    [r] = tick(cfg, store, NOW)
    reports.append(r)
    with open(live, "a") as fh:
        fh.write("z" * 30_000)
    [r] = tick(cfg, store, NOW + timedelta(minutes=1))
    reports.append(r)
    with open(live, "a") as fh:
        fh.write('"}\n' + valid_lines(20, 30))
    for k in (2, 3):
        [r] = tick(cfg, store, NOW + timedelta(minutes=k))
        reports.append(r)
    with store.transaction() as s:
        quoted = [(q["position"], q["excerpt"]) for q in store.quarantine.search(s, "churn")]
    store.dispose()
    assert all(r.status == "ok" for r in reports), [r.error for r in reports]
    assert [r.quarantined for r in reports] == [{"oversize_line": 1}, {}, {}, {}]
    [(position, text)] = quoted
    assert position == "app.jsonl:31" and "at least" in text
    assert sum(r.accepted["predictions"] for r in reports) == 50 and reports[-1].read["predictions"] == 0
    read = sum(r.read["predictions"] for r in reports)
    record_property("rel_inputs", 1)
    record_property("rel_rows", read)
    record_property("rel_rows_lost", 51 - read)
