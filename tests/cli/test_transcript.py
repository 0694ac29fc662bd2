"""A new user's first hour, as a transcript: from a clean directory holding a fraud model's logs in their own
shape (`id`, `timestamp` in epoch milliseconds, `model`, latency and stage timings in seconds), the installed
`tailwatch` script runs as a subprocess for each step the README's quick start gives: `init`, the mapping
edited into the file `init` wrote, `check-logs`, `db upgrade`, `reference build`, `tick`, `run --once`,
`query findings`, `query incidents` and `explain`; and, without the mapping, the same logs: `check-logs`' and
`tick`'s warnings naming request_id, ts and model_version, and the daemon's `no_data` alert. Every assertion
is on what the user reads: the tables and messages (JSON where a table cell would wrap), and the exit code."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

EXE = shutil.which("tailwatch", path=str(Path(sys.executable).parent))
START = datetime(2026, 12, 3, 0, 0, tzinfo=UTC)
HOURS = 8
SLOW_FROM = START + timedelta(hours=6)  # the model stage takes 6x as long from here on
NOW = "2026-12-03T08:00:00Z"
CATEGORIES = ["grocery", "travel", "electronics", "fuel", "restaurants"]
COUNTRIES = ["DE", "FR", "NL", "ES", "IT"]
# Two lines a person wrote by hand among the service's own: a time nobody can read, a status it does not know.
BAD = [b'{"id": "tx-bad-1", "timestamp": "yesterday", "model": "fraud-v7", "status": "ok", "latency": 0.01}',
       b'{"id": "tx-bad-2", "timestamp": 1796259600000, "model": "fraud-v7", "status": "fine", "latency": 0.01}']
SCHEMA = """    schema:
      features:
        amount: numeric           # EUR
        merchant_category: categorical
        country: categorical
        channel: categorical
      segments: [channel]
      classes: [legit, fraud]
      positive_class: fraud       # scores in score_fraud
"""


def tw(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The installed script, as a shell runs it (a wide terminal, so no table wraps a name)."""
    return subprocess.run([EXE, *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200", "TAILWATCH_CONFIG": ""})


def write_logs(root: Path) -> int:
    """Eight hours of a fraud model's predictions (JSON Lines), its stage timings and a reference sample,
    with the two hand-written bad lines; returns the predictions written (bad lines included)."""
    rng = random.Random(23)
    preds, stages = [], []
    at, i = START, 0
    while at < START + timedelta(hours=HOURS):
        i += 1
        amount = round(rng.lognormvariate(3.5, 1.0), 2)
        category = rng.choice(CATEGORIES)
        score = min(0.99, rng.betavariate(1, 12) + (0.4 if category == "electronics" and amount > 150 else 0))
        lookup, pre = rng.uniform(0.002, 0.004), rng.uniform(0.0005, 0.001)
        model = rng.uniform(0.004, 0.008) * (6 if at >= SLOW_FROM else 1)
        preds.append(json.dumps({
            "id": f"tx-{i:05d}", "timestamp": int(at.timestamp() * 1000) + rng.randint(0, 999), "model": "fraud-v7",
            "status": "ok", "latency": round(lookup + pre + model, 6), "amount": amount,
            "merchant_category": category, "country": rng.choice(COUNTRIES), "channel": rng.choice(["web", "pos"]),
            "prediction": "fraud" if score >= 0.5 else "legit", "score_fraud": round(score, 3)}).encode())
        for stage, seconds in (("feature_lookup", lookup), ("preprocess", pre), ("model", model)):
            stages.append(json.dumps({"id": f"tx-{i:05d}", "stage": stage, "took": round(seconds, 6)}).encode())
        at += timedelta(seconds=rng.expovariate(1 / 12))
    preds[100:100] = BAD[:1]
    preds[900:900] = BAD[1:]
    reference = [json.dumps({"amount": round(rng.lognormvariate(3.5, 1.0), 2), "merchant_category": rng.choice(CATEGORIES),
                             "country": rng.choice(COUNTRIES), "channel": rng.choice(["web", "pos"])}).encode()
                 for _ in range(2000)]
    for folder, name, lines in (("logs/fraud", "2026-12-03.jsonl", preds),
                                ("logs/fraud-stages", "2026-12-03.jsonl", stages), (".", "reference.jsonl", reference)):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / name).write_bytes(b"\n".join(lines) + b"\n")
    return len(preds)


def set_key(text: str, block: str, key: str, value: str) -> str:
    """`text` with `key`'s value under the `block:` of `sources` set to `value`, its comment kept: what a
    person does in an editor. The key must be written in the block (the template shows it)."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.strip() == f"{block}:")
    indent = len(lines[start]) - len(lines[start].lstrip())
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.strip() and not line.lstrip().startswith("#") and len(line) - len(line.lstrip()) <= indent:
            break
        found = re.match(rf"^(\s+{re.escape(key)}:)( *)(\S[^#]*?)( *#.*)?$", line.rstrip("\n"))
        if found:
            lines[i] = f"{found[1]} {value}{found[4] or ''}\n"
            return "".join(lines)
    raise AssertionError(f"{block}: has no {key}: line in the template")


def describe_the_logs(text: str) -> str:
    """The edits every user makes to `init`'s file: where the logs are, what they hold, the reference."""
    assert text.count("  - name: churn\n") == 1
    text = text.replace("  - name: churn\n", "  - name: fraud\n")
    text = set_key(text, "predictions", "path", "./logs/fraud")
    text = set_key(text, "timings", "path", "./logs/fraud-stages")
    schema = re.search(r"^    schema:\n(?:      .*\n)+", text, re.MULTILINE)
    assert schema, "the template has a schema block"
    text = text.replace(schema[0], SCHEMA)
    assert text.count("    # reference: {path: ./reference.parquet}") == 1
    return text.replace("    # reference: {path: ./reference.parquet}", "    reference: {path: ./reference.jsonl}")


def map_the_columns(text: str) -> str:
    """The mapping from the contract's names and units to the logs'."""
    text = set_key(text, "predictions", "columns",
                   "{request_id: id, ts: timestamp, model_version: model, latency_ms: latency}")
    text = set_key(text, "predictions", "timestamps", "{epoch_unit: ms}")
    text = set_key(text, "predictions", "durations", "s")
    text = set_key(text, "timings", "columns", "{request_id: id, duration_ms: took}")
    return set_key(text, "timings", "durations", "s")


def row(output: str, first: str) -> list[str]:
    """The cells of the table row starting with `first` (the first such row)."""
    for line in output.splitlines():
        cells = [c for c in re.split(r"\s{2,}|│|┃", line) if c.strip()]
        if cells and cells[0].strip() == first:
            return [c.strip() for c in cells]
    raise AssertionError(f"no row {first!r} in:\n{output}")


@pytest.fixture
def fresh(tmp_path) -> Path:
    """A clean directory holding only the logs and a reference sample; `init` has written its config."""
    write_logs(tmp_path)
    made = tw("init", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "wrote tailwatch.yaml" in made.stdout
    config = tmp_path / "tailwatch.yaml"
    config.write_text(describe_the_logs(config.read_text()))
    return tmp_path


def test_foreign_logs_from_init_to_explain(fresh):
    written = (fresh / "logs/fraud/2026-12-03.jsonl").read_bytes().count(b"\n")
    config = fresh / "tailwatch.yaml"

    # Before the mapping: the sample says nothing would be accepted, and which fields to map.
    unmapped = tw("check-logs", "--now", NOW, cwd=fresh)
    assert unmapped.returncode == 1, unmapped.stdout + unmapped.stderr
    said = " ".join(unmapped.stdout.split())
    assert "warning: required fields not found: request_id, ts, model_version; every row would be quarantined" in said
    assert "under sources.predictions.columns" in said
    assert "columns no field is read from: id, timestamp, model, latency" in said
    assert "warning: required fields not found: request_id, duration_ms" in said
    assert not (fresh / "tailwatch.db").exists()  # check-logs wrote nothing

    config.write_text(map_the_columns(config.read_text()))
    checked = tw("check-logs", "--now", NOW, "--lines", str(written), cwd=fresh)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"fraud predictions (logs/fraud): {written:,} rows read, {written - 2:,} accepted, 2 quarantined" \
        in checked.stdout
    assert "not found" not in checked.stdout and "warning" not in checked.stdout
    # Every contract field from its column, the first row's time and latency as the contract reads them.
    first = json.loads((fresh / "logs/fraud/2026-12-03.jsonl").read_text().splitlines()[0])
    stamp = datetime.fromtimestamp(first["timestamp"] / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
    assert row(checked.stdout, "request_id *")[1:3] == ["id", first["id"]]
    assert row(checked.stdout, "ts *")[1:3] == ["timestamp", str(first["timestamp"])]
    assert f"ts: {first['timestamp']} is read as {stamp.rstrip('0')}Z\n" in checked.stdout
    assert row(checked.stdout, "model_version *")[1:3] == ["model", "fraud-v7"]
    assert row(checked.stdout, "status *")[1:3] == ["status", "ok"]
    assert row(checked.stdout, "latency_ms")[1:3] == ["latency", str(first["latency"])]
    assert f"latency_ms: {first['latency']} is read as {first['latency'] * 1000:,.6g} ms\n" in checked.stdout
    for name in ("amount", "merchant_category", "country", "channel", "prediction", "score_fraud"):
        assert row(checked.stdout, name)[1] == name
    assert row(checked.stdout, "duration_ms *")[1] == "took"
    assert row(checked.stdout, "wrong_type")[1:3] == ["1", "ts"]
    assert row(checked.stdout, "unknown_status")[1:3] == ["1", "status"]
    assert BAD[0].decode() in checked.stdout and BAD[1].decode() in checked.stdout  # the lines as written

    for step in (("db", "upgrade"), ("reference", "build")):
        done = tw(*step, cwd=fresh)
        assert done.returncode == 0, done.stdout + done.stderr
    ticked = tw("tick", "--now", NOW, cwd=fresh)
    assert ticked.returncode == 0, ticked.stdout + ticked.stderr
    assert row(ticked.stdout, "predictions: read")[1] == f"{written:,}"
    assert row(ticked.stdout, "predictions: accepted")[1] == f"{written - 2:,}"
    assert row(ticked.stdout, "timings: accepted")[1] == f"{3 * (written - 2):,}"
    assert row(ticked.stdout, "joined with timings")[1] == f"{written - 2:,}"
    assert "warning" not in ticked.stdout + ticked.stderr

    decided = tw("run", "--once", "--now", NOW, cwd=fresh)  # verdicts and alerts over what the tick stored
    assert decided.returncode == 0, decided.stderr

    found = tw("query", "findings", "--since", "2026-12-03T00:00:00Z", "--status", "breach", "--check", "latency",
               cwd=fresh)
    assert found.returncode == 0, found.stderr
    breaches = [line for line in found.stdout.splitlines() if "fraud-v7" in line and "breach" in line]
    assert breaches and all("latency" in line for line in breaches)
    assert any("stage=model" in line for line in breaches)
    assert not any("stage=feature_lookup" in line or "stage=preprocess" in line for line in breaches)

    incidents = tw("query", "incidents", "-f", "json", cwd=fresh)
    assert incidents.returncode == 0, incidents.stderr
    [incident] = json.loads(incidents.stdout)
    assert incident["verdict"] == "slower" and incident["model_version"] == "fraud-v7"
    explained = tw("explain", str(incident["id"]), cwd=fresh)
    assert explained.returncode == 0, explained.stderr
    assert f"incident {incident['id']} (open), model version fraud-v7" in explained.stdout
    assert "points at: stage model" in explained.stdout
    assert "next queries" in explained.stdout and "--stage model" in explained.stdout


def test_the_same_logs_without_the_mapping_warn_naming_the_fields(fresh):
    assert tw("db", "upgrade", cwd=fresh).returncode == 0
    ticked = tw("tick", "--now", NOW, cwd=fresh)
    assert ticked.returncode == 0, ticked.stdout + ticked.stderr
    assert row(ticked.stdout, "predictions: accepted")[1] == "0"
    said = " ".join(ticked.stdout.split())
    assert re.search(r"warning: quarantined [\d,]+ of [\d,]+ rows \(100%, above limits.max_quarantine_share 50%\)",
                     said), said
    assert "missing_field" in said and "predictions: request_id, ts, model_version" in said
    assert "`tailwatch check-logs` shows what each field is read from" in said

    # The service keeps logging in its shape; the daemon's next job quarantines that too and says so as no_data.
    log = fresh / "logs/fraud/2026-12-03.jsonl"
    more = log.read_bytes().splitlines()[-50:]
    with log.open("ab") as f:
        f.write(b"".join(line.replace(b'"tx-', b'"tx-late-') + b"\n" for line in more))
    decided = tw("run", "--once", "--now", "2026-12-03T08:05:00Z", cwd=fresh)
    assert decided.returncode == 0, decided.stderr
    shown = tw("alerts", cwd=fresh)
    assert shown.returncode == 0 and "no_data" in shown.stdout and "source=quarantine" in shown.stdout
    [alert] = [a for a in json.loads(tw("alerts", "-f", "json", cwd=fresh).stdout)["alerts"]
               if a["labels"].get("source") == "quarantine"]
    assert alert["labels"]["alertname"] == "no_data"
    assert alert["summary"].startswith("fraud's logs are mostly quarantined: quarantined 50 of 50 rows (100%")
    assert "predictions: request_id, ts, model_version" in alert["summary"]

    # Logs arrive less often than the daemon ticks: a job that reads no new lines keeps the alert.
    quiet = tw("run", "--once", "--now", "2026-12-03T08:10:00Z", cwd=fresh)
    assert quiet.returncode == 0, quiet.stderr
    assert [a["labels"]["alertname"] for a in json.loads(tw("alerts", "-f", "json", cwd=fresh).stdout)["alerts"]
            if a["labels"].get("source") == "quarantine"] == ["no_data"]
