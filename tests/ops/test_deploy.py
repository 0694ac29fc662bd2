"""deploy/: the Kubernetes manifests, compose file and example config parse and hold what operations
rely on; the Dockerfile is multi-stage, slim, non-root, exec-form and installs pinned versions; the systemd
unit verifies and its user is created."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from monitor import config as config_mod

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()) if d]


def test_kubernetes_manifests_parse_and_hold_the_operational_fields():
    kinds = {d["kind"]: d for name in sorted(p.name for p in (DEPLOY / "k8s").glob("*.yaml")) for d in _docs(name)}
    assert {"Deployment", "CronJob", "ConfigMap", "Secret", "Service"} <= set(kinds)
    dep = kinds["Deployment"]["spec"]
    assert dep["replicas"] == 1 and dep["strategy"]["type"] == "Recreate"
    pod = dep["template"]["spec"]
    (main,) = pod["containers"]
    assert main["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["initContainers"][0]["args"] == ["db", "upgrade"]
    cron = kinds["CronJob"]["spec"]
    assert cron["concurrencyPolicy"] == "Forbid" and len(cron["schedule"].split()) == 5
    assert cron["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"] == ["nightly"]
    # The config the pods mount is a valid tailwatch config (paths aside), with the nightly left to the CronJob
    # and the probe server reachable from the kubelet.
    raw = yaml.safe_load(kinds["ConfigMap"]["data"]["tailwatch.yaml"])
    daemon = config_mod.Daemon.model_validate(raw["daemon"])
    assert daemon.nightly is None and daemon.health.host == "0.0.0.0"
    grace = pod["terminationGracePeriodSeconds"]
    assert grace > daemon.shutdown_timeout.total_seconds()
    assert kinds["Secret"]["type"] == "Opaque"


def test_compose_and_example_config(tmp_path):
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "tailwatch", "migrate"} <= set(services)
    assert services["tailwatch"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["tailwatch"]["ports"][0].startswith("127.0.0.1:")
    example = yaml.safe_load((DEPLOY / "tailwatch.example.yaml").read_text())
    # Point the log directories at tmp so the config validates as a whole.
    for kind in ("predictions", "timings"):
        (tmp_path / kind).mkdir()
        example["services"][0]["sources"][kind]["path"] = str(tmp_path / kind)
    cfg = config_mod.parse(example, base_dir=tmp_path)
    assert cfg.daemon.shutdown_timeout.total_seconds() < _seconds(services["tailwatch"]["stop_grace_period"])


def _seconds(text: str) -> int:
    return int(text.rstrip("s"))


def test_dockerfile_is_multi_stage_slim_non_root_exec_form():
    text = (DEPLOY / "Dockerfile").read_text()
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert len(froms) >= 2 and all("slim" in f for f in froms)
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    entry = re.search(r"^ENTRYPOINT (.+)$", text, re.M).group(1)
    assert json.loads(entry) == ["tailwatch"]  # exec form: a JSON array, no shell


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_unit_verifies(tmp_path):
    unit = (DEPLOY / "tailwatch.service").read_text()
    assert "Type=notify" in unit and re.search(r"^WatchdogSec=\d+", unit, re.M)
    # verify checks that the executables exist: point them at this checkout's tailwatch.
    exe = shutil.which("tailwatch") or str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "tailwatch")
    path = tmp_path / "tailwatch.service"
    path.write_text(unit.replace("/opt/tailwatch/bin/tailwatch", exe))
    proc = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert not [line for line in proc.stderr.splitlines() if "tailwatch.service" in line], proc.stderr


def _validate_with_tmp_logs(raw: dict, tmp_path: Path) -> config_mod.Config:
    """Validate a shipped config as a whole, its log directories pointed at tmp."""
    for service in raw["services"]:
        for name, source in service["sources"].items():
            (tmp_path / service["name"] / name).mkdir(parents=True, exist_ok=True)
            source["path"] = str(tmp_path / service["name"] / name)
    return config_mod.parse(raw, base_dir=tmp_path)


def test_kubernetes_pods_can_read_their_secrets_and_the_config_uses_the_slack_token(tmp_path):
    kinds = {d["kind"]: d for name in sorted(p.name for p in (DEPLOY / "k8s").glob("*.yaml")) for d in _docs(name)}
    pods = {"Deployment": kinds["Deployment"]["spec"]["template"]["spec"],
            "CronJob": kinds["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]}
    for kind, pod in pods.items():
        secret_volumes = [v for v in pod["volumes"] if "secret" in v]
        user = pod["securityContext"]["runAsUser"]
        # A 0400 secret volume is root's unless fsGroup makes it readable by the pod's group.
        assert secret_volumes and pod["securityContext"].get("fsGroup") == pod["securityContext"]["runAsGroup"], kind
        assert user == 10001
    cfg = _validate_with_tmp_logs(yaml.safe_load(kinds["ConfigMap"]["data"]["tailwatch.yaml"]), tmp_path)
    mount = next(m["mountPath"] for m in pods["Deployment"]["containers"][0]["volumeMounts"] if m["name"] == "secrets")
    keys = set(kinds["Secret"]["stringData"])
    for secret in (cfg.alerts.slack.token, cfg.storage.password):
        assert secret.file is not None and secret.file.parent == Path(mount) and secret.file.name in keys
    assert cfg.alerts.slack.channel


def test_compose_names_its_secrets_and_the_example_config_uses_them(tmp_path):
    text = (DEPLOY / "docker-compose.yml").read_text()
    compose = yaml.safe_load(text)
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    for name, spec in compose["secrets"].items():
        assert f"deploy/secrets/{name}" in header, f"the header does not say how to write secret {name}"
        assert spec["file"] == f"./secrets/{name}"
    assert "chmod 444 deploy/secrets/*" in header  # bind-mounted as they are: uid 10001 must read them
    used = {s for svc in compose["services"].values() for s in svc.get("secrets", [])}
    assert used == set(compose["secrets"])
    cfg = _validate_with_tmp_logs(yaml.safe_load((DEPLOY / "tailwatch.example.yaml").read_text()), tmp_path)
    tailwatch = set(compose["services"]["tailwatch"]["secrets"])
    for secret in (cfg.alerts.slack.token, cfg.storage.password):
        assert secret.file is not None and secret.file.parent == Path("/run/secrets") and secret.file.name in tailwatch


def test_compose_runs_prometheus_alertmanager_and_grafana_on_the_shipped_files():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"prometheus", "alertmanager", "grafana"} <= set(services)
    for name in ("prometheus", "alertmanager", "grafana"):
        binds = [v.split(":")[0] for v in services[name]["volumes"] if v.startswith("./")]
        assert binds and all((DEPLOY / b).exists() for b in binds), name
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"])
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert prometheus["scrape_configs"][0]["static_configs"][0]["targets"] == ["tailwatch:9464"]
    assert prometheus["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    alertmanager = yaml.safe_load((DEPLOY / "alertmanager" / "alertmanager.yml").read_text())
    routes = {r["receiver"]: r["matchers"] for r in alertmanager["route"]["routes"]}
    assert routes["pager"] == ['severity=~"critical|page"'] and routes["chat"] == ['severity=~"warning|warn"']
    files = [c.get(k) for r in alertmanager["receivers"] for cs in r.values() if isinstance(cs, list) for c in cs
             for k in ("routing_key_file", "api_url_file") if c.get(k)]
    assert {Path(f).name for f in files} == set(services["alertmanager"]["secrets"])


def test_image_installs_the_pinned_versions_and_they_satisfy_pyproject():
    assert "--constraint constraints.txt" in (DEPLOY / "Dockerfile").read_text()
    pins = {}
    for line in (DEPLOY / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line}"
            pins[canonicalize_name(name)] = Version(version)
    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["postgres"]]
    for req in wanted:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in deploy/constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} outside {req.specifier}"
        for extra in req.extras:  # psycopg[binary]
            assert canonicalize_name(f"{req.name}-{extra}") in pins


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd-sysusers not installed")
def test_sysusers_creates_the_user_the_unit_runs_as(tmp_path):
    unit = (DEPLOY / "tailwatch.service").read_text()
    user = re.search(r"^User=(\S+)", unit, re.M).group(1)
    assert "deploy/tailwatch.sysusers" in unit
    (tmp_path / "etc").mkdir()
    done = subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(DEPLOY / "tailwatch.sysusers")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    passwd = {line.split(":")[0]: line.split(":") for line in (tmp_path / "etc" / "passwd").read_text().splitlines()}
    assert user in passwd and passwd[user][5] == "/var/lib/tailwatch" and passwd[user][6] == "/usr/sbin/nologin"
