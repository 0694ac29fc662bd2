"""The shipped Prometheus, Alertmanager and Grafana files against the real binaries (Debian's `prometheus`
and `prometheus-alertmanager`, installed by `make test` through tests/setup/debian.sh): promtool and amtool
accept them, a real Prometheus scrapes a tailwatch health server whose store a simulated scenario filled and
returns the stored values through PromQL, and every Grafana panel's query returns data from it."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from promscenario import stored

from monitor.daemon.health import Health, Metrics, serve
from monitor.daemon.model_metrics import ModelMetrics
from storage.store import Store

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "tailwatch.json"
WAIT_S = 30.0  # upper bound of every poll below; each returns as soon as its condition holds


def binary(name: str, package: str) -> str:
    """The path of a Debian package's binary; a missing one fails under CI=true and skips elsewhere."""
    path = shutil.which(name) or next((p for p in (f"/usr/bin/{name}", f"/usr/sbin/{name}") if os.path.exists(p)),
                                      None)
    if path is None:
        reason = f"{name} is not installed and tests/setup/debian.sh could not install {package} (needs root)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_promtool_and_amtool_accept_the_shipped_files():
    # check config / check rules / the rules' unit tests (deploy/prometheus/tests) / check-config
    promtool = binary("promtool", "prometheus")
    amtool = binary("amtool", "prometheus-alertmanager")
    for done in (run(promtool, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")),
                 run(promtool, "check", "rules", *map(str, sorted((DEPLOY / "prometheus" / "rules").glob("*.yml")))),
                 run(promtool, "test", "rules", str(DEPLOY / "prometheus" / "tests" / "tailwatch_test.yml")),
                 run(amtool, "check-config", str(DEPLOY / "alertmanager" / "alertmanager.yml"))):
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SUCCESS" in done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def poll(what: str, fn, timeout: float = WAIT_S):
    """fn() until it returns something truthy (errors count as not yet); fails naming `what` after timeout."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            result = fn()
        except (OSError, ValueError) as exc:
            result, last = None, exc
        if result:
            return result
        time.sleep(0.2)
    pytest.fail(f"{what} not within {timeout:g}s (last error: {last})")


class Prometheus:
    """A real Prometheus on 127.0.0.1, queried through its HTTP API."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict]:
        data = get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert data["status"] == "success", data
        return data["data"]["result"]

    def label_values(self, selector: str, label: str) -> list[str]:
        data = get(f"{self.url}/api/v1/series?" + urllib.parse.urlencode({"match[]": selector}))
        return sorted({s[label] for s in data["data"] if label in s})


@pytest.fixture(scope="module")
def prometheus(filled_run, tmp_path_factory) -> Iterator[Prometheus]:
    """The scenario's store behind a tailwatch health server, scraped every 5 s by a real Prometheus
    configured from deploy/prometheus (targets and intervals changed for the test, rules as shipped)."""
    exe = binary("prometheus", "prometheus")
    cfg, now = filled_run["config"], filled_run["now"]
    store = Store(cfg.storage.url)
    server = serve(Health(store, 60, Metrics(ModelMetrics(cfg, store, clock=lambda: now))), "127.0.0.1", 0)
    work = tmp_path_factory.mktemp("prometheus")
    shipped = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    # A scrape reads the store (0.1-0.4 s quiet, seconds on a loaded machine); one that outlives its timeout
    # marks every series stale, so the timeout is generous and the interval matches it.
    shipped["global"] |= {"scrape_interval": "5s", "scrape_timeout": "5s", "evaluation_interval": "1s"}
    shipped["rule_files"] = [str(DEPLOY / "prometheus" / f) for f in shipped["rule_files"]]
    shipped.pop("alerting")  # no Alertmanager here: the rules are checked through ALERTS
    (job,) = shipped["scrape_configs"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{server.server_address[1]}"]}]
    (work / "prometheus.yml").write_text(yaml.safe_dump(shipped))
    port = free_port()
    log = open(work / "prometheus.log", "wb")
    proc = subprocess.Popen([exe, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        prom = Prometheus(f"http://127.0.0.1:{port}")
        poll("Prometheus ready", lambda: proc.poll() is None and urllib.request.urlopen(
            f"{prom.url}/-/ready", timeout=2).status == 200)
        poll("a scrape of tailwatch", lambda: prom.query('up{job="tailwatch"} == 1')
             and prom.query("tailwatch_quality_samples"))
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        server.shutdown()
        store.dispose()
        if proc.returncode not in (0, -15, -9):
            print((work / "prometheus.log").read_text()[-3000:])


def vector(results: list[dict]) -> dict[tuple[str, tuple], float]:
    out = {}
    for r in results:
        labels = dict(r["metric"])
        name = labels.pop("__name__")
        labels.pop("instance"), labels.pop("job")
        out[(name, tuple(sorted(labels.items())))] = float(r["value"][1])
    return out


def test_promql_returns_the_stored_latency_drift_and_quality(prometheus, filled_run):
    want = stored(filled_run["config"])
    got = {}
    for name in ("tailwatch_stage_latency_seconds", "tailwatch_field_drift_psi", "tailwatch_quality_score",
                 "tailwatch_quality_samples"):
        got |= vector(prometheus.query(name))
    families = {name for name, _ in want}
    assert families == {"tailwatch_stage_latency_seconds", "tailwatch_field_drift_psi", "tailwatch_quality_score",
                        "tailwatch_quality_samples"}
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9), key


def test_shipped_rules_evaluate_on_the_exported_series(prometheus):
    # Recording rules produce series, and the slower verdict of v2 is a pending TailwatchModelSlower (for: 5m).
    total = poll("the total p95 recording rule", lambda: prometheus.query(
        "service_model_window:tailwatch_stage_latency_seconds:total_p95"))
    assert {r["metric"]["model_version"] for r in total} == {"v1", "v2"}
    pending = poll("TailwatchModelSlower pending", lambda: prometheus.query(
        'ALERTS{alertname="TailwatchModelSlower", alertstate="pending"}'))
    assert {r["metric"]["model_version"] for r in pending} == {"v2"}
    assert {r["metric"]["severity"] for r in pending} == {"critical"}
    assert not prometheus.query('ALERTS{alertname="TailwatchModelSlower", model_version="v1"}')


def resolve_variables(dashboard: dict, prom: Prometheus) -> dict[str, str]:
    """Each template variable's value as Grafana would pick it: `All` (its allValue) for multi-value ones, the
    current value of a custom one, else the first value its label_values() query finds in Prometheus."""
    values: dict[str, str] = {}
    for var in dashboard["templating"]["list"]:
        if var["type"] == "custom":
            values[var["name"]] = var["current"]["value"]
            continue
        assert var["type"] == "query", var
        if var.get("includeAll") and var.get("multi"):
            values[var["name"]] = var["allValue"]
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", substitute(query, values))
        assert match, query
        found = prom.label_values(match.group(1), match.group(2))
        assert found, f"variable {var['name']}: {query} finds nothing"
        values[var["name"]] = found[0]
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m.group(1) or m.group(2), m.group(0)), expr)


def test_every_grafana_panel_query_returns_data(prometheus):
    dashboard = json.loads(DASHBOARD.read_text())
    values = resolve_variables(dashboard, prometheus)
    titles = [p["title"] for p in dashboard["panels"]]
    for wanted in ("Verdict timeline", "Latency per stage", "Failed", "Cache hit ratio", "Drift per field",
                   "Quality per group", "Quality n per group"):
        assert any(t.startswith(wanted) for t in titles), wanted
    queried = 0
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "tailwatch-prometheus"
        for target in panel["targets"]:
            expr = substitute(target["expr"], values)
            assert "$" not in expr, expr
            poll(f"panel {panel['title']!r}: data from {expr}", lambda e=expr: prometheus.query(e))
            queried += 1
    assert queried >= len(dashboard["panels"])
    provisioned = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert provisioned["datasources"][0]["uid"] == "tailwatch-prometheus"
