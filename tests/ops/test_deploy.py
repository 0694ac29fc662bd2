"""deploy/: the Kubernetes manifests, compose file and example config parse and hold what operations
rely on; the Dockerfile is multi-stage, slim, non-root, exec-form; the systemd unit verifies."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

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
