"""Config: validation errors name the field path and the bad value; secrets never inline."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import yaml

from monitor import config as config_mod
from monitor.config import ConfigError, parse, parse_duration


def service(tmp_path, **extra) -> dict:
    (tmp_path / "logs").mkdir(exist_ok=True)
    return {"name": "churn", "sources": {"predictions": {"kind": "files", "path": "./logs"}}} | extra


def error_of(raw, base_dir) -> str:
    with pytest.raises(ConfigError) as exc:
        parse(raw, base_dir=base_dir)
    return str(exc.value)


def test_missing_directory_names_path_and_value(tmp_path):
    raw = {"services": [{"name": "churn", "sources": {"predictions": {"kind": "files", "path": "./logs"}}}]}
    assert error_of(raw, tmp_path) == "services[0].sources.predictions.path: directory does not exist: ./logs"


def test_relative_paths_resolve_against_the_config_file(tmp_path):
    cfg = parse({"services": [service(tmp_path)]}, base_dir=tmp_path)
    assert cfg.services[0].sources.predictions.path == tmp_path / "logs"
    assert cfg.storage.url == f"sqlite:///{tmp_path / 'tailwatch.db'}"


@pytest.mark.parametrize(("patch", "expected"), [
    ({"buckets": {"size": "5 parsecs"}}, "services[0].buckets.size: not a duration"),
    ({"buckets": {"size": "5m", "windows": ["7m"]}}, "window 0:07:00 is not a whole number of buckets of 0:05:00"),
    ({"schema": {"features": {"tenure": "numerical"}}}, "services[0].schema.features.tenure: Input should be"),
    ({"schema": {"classes": ["No", "Yes"], "positive_class": "Maybe"}}, "positive_class 'Maybe' is not one of"),
    ({"name": "has spaces"}, "services[0].name: String should match pattern"),
    ({"surprise": 1}, "services[0].surprise: Extra inputs are not permitted"),
])
def test_field_errors(tmp_path, patch, expected):
    assert expected in error_of({"services": [service(tmp_path) | patch]}, tmp_path)


def test_an_unknown_key_names_the_one_meant(tmp_path):
    def error(**patch):
        svc = service(tmp_path)
        svc["sources"]["predictions"] |= patch.pop("source", {})
        return error_of({"services": [svc | patch.pop("service", {})], **patch}, tmp_path)

    # A misspelt key names the one meant, wherever it sits: a section, a list item, a source of either kind.
    assert "daemon.intervall: Extra inputs are not permitted (got '1m'); did you mean 'interval'?" \
        in error(daemon={"intervall": "1m"})
    assert "services[0].schema.clases: Extra inputs are not permitted (got ['a', 'b']); did you mean 'classes'?" \
        in error(service={"schema": {"clases": ["a", "b"]}})
    assert "services[0].sources.predictions.patern: Extra inputs are not permitted (got '*.csv'); did you mean " \
        "'pattern'?" in error(source={"patern": "*.csv"})
    assert "storage.ulr: Extra inputs are not permitted (got 'sqlite:///x.db'); did you mean 'url'?" \
        in error(storage={"ulr": "sqlite:///x.db"})
    # Nothing close: the keys the section takes, as written (`for`, not the model's `for_`).
    said = error(service={"zzzz": 1})
    assert "services[0].zzzz: Extra inputs are not permitted (got 1); known here: accepted_versions, baseline," in said
    assert "known here: burn_rate, for, keep_firing_for," in error(
        service={"rules": [{"name": "r", "slo": "errors", "qqqq": "5m"}]})
    # An optional section (`quality: Quality | None`) lists its keys too.
    assert "services[0].quality.qqqq: Extra inputs are not permitted (got 1); known here: accepted_version," in error(
        service={"quality": {"windows": ["1d"], "qqqq": 1}})


def test_unique_service_names(tmp_path):
    assert "repeated: ['churn']" in error_of({"services": [service(tmp_path), service(tmp_path)]}, tmp_path)


def test_inline_password_is_refused_and_not_echoed(tmp_path):
    msg = error_of({"storage": {"url": "postgresql+psycopg://tw:hunter2-canary@db/tw"},
                    "services": [service(tmp_path)]}, tmp_path)
    assert "storage.url: inline password" in msg and "hunter2-canary" not in msg


def test_password_from_env_and_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TW_TEST_DB_PASSWORD", "s3cret")
    cfg = parse({"storage": {"url": "postgresql+psycopg://tw@db/tw", "password": {"env": "TW_TEST_DB_PASSWORD"}},
                 "services": [service(tmp_path)]}, base_dir=tmp_path)
    assert cfg.storage.resolved_url().password == "s3cret"
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    secret.chmod(0o644)
    cfg = parse({"storage": {"url": "postgresql+psycopg://tw@db/tw", "password": {"file": str(secret)}},
                 "services": [service(tmp_path)]}, base_dir=tmp_path)
    assert cfg.storage.resolved_url().password == "from-file"
    assert any("readable by group or others" in w for w in cfg.warnings())
    secret.chmod(0o600)
    assert cfg.warnings() == []
    if os.getuid() == 0:
        secret.chmod(0o440)
        os.chown(secret, 0, 10001)
        assert cfg.warnings() and cfg.warnings()[0].endswith("chmod 600 it")
        os.chown(secret, 10001, 10001)  # another user may replace it
        assert [w.split("), ")[-1] for w in cfg.warnings()] == ["who could replace the secret; chown it to uid 0"]
        # On a read-only mount (Kubernetes fsGroup, compose secrets) nobody here can: not ours to chown.
        monkeypatch.setattr("monitor.config.fields._read_only", lambda path: True)
        assert cfg.warnings() == []


def test_unset_secret_names_the_variable_only(tmp_path):
    cfg = parse({"storage": {"url": "postgresql+psycopg://tw@db/tw", "password": {"env": "TW_NOT_SET_ANYWHERE"}},
                 "services": [service(tmp_path)]}, base_dir=tmp_path)
    with pytest.raises(ConfigError, match="TW_NOT_SET_ANYWHERE is not set"):
        cfg.storage.resolved_url()


def test_secret_needs_exactly_one_source(tmp_path):
    msg = error_of({"storage": {"password": {}}, "services": [service(tmp_path)]}, tmp_path)
    assert "storage.password: give exactly one of env" in msg


def test_durations():
    assert parse_duration("5m") == timedelta(minutes=5)
    assert parse_duration("1.5h") == timedelta(minutes=90)
    assert parse_duration(30) == timedelta(seconds=30)
    assert parse_duration("250ms") == timedelta(milliseconds=250)
    with pytest.raises(ValueError):
        parse_duration(True)


def test_example_config_is_valid_once_its_directories_exist(tmp_path):
    for name in ("predictions", "timings", "labels"):
        (tmp_path / "logs" / name).mkdir(parents=True)
    cfg = parse(yaml.safe_load(config_mod.example()), base_dir=tmp_path)
    assert cfg.services[0].schema_.positive_class == "Yes"
    # Its commented values: example loads once uncommented, mapping the service's own status words.
    example = "# values: {status: {finished: ok, aborted: cancelled}}"
    assert config_mod.example().count(example) == 1
    cfg = parse(yaml.safe_load(config_mod.example().replace(example, example[2:])), base_dir=tmp_path)
    assert cfg.services[0].sources.predictions.values == {"status": {"finished": "ok", "aborted": "cancelled"}}


def test_load_reports_missing_file_and_bad_yaml(tmp_path, monkeypatch):
    monkeypatch.delenv(config_mod.ENV_CONFIG, raising=False)
    with pytest.raises(ConfigError, match="config file not found"):
        config_mod.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("services: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config_mod.load(bad)
    monkeypatch.setenv(config_mod.ENV_CONFIG, os.fspath(bad))
    with pytest.raises(ConfigError, match="bad.yaml"):
        config_mod.load()
