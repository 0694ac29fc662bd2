"""Secrets are never echoed: a secret written where the config wants {env: ...} or {file: ...} (inline, in a
list, as a key, as a variable's name), a password on a database URL (in its user part or its query, parsable
or not) and credentials on an Alertmanager URL are refused by `tailwatch check-logs` and `tailwatch db
upgrade` with an error that names the field and says how to pass a secret, and never holds the value; nor
does pydantic's own rendering of the error. A secret file that others could replace (writable by group or
others, owned by another user) is warned about, without its value.

Each test records what it tried as pytest user properties (`rel_inputs`), which `make reliability` sums.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from monitor.cli import app
from monitor.config.model import Config

pytestmark = pytest.mark.reliability

CANARY = "xoxb-cAnArY-7731-Zq8x"  # a Slack bot token's shape: not a variable name (its dashes)
URL_CANARY = "cAnArY-pw-4471"

SECRETS = {  # where a secret goes -> how to put one there in a config
    "storage.password": lambda raw, v: raw["storage"].update(password=v),
    "storage.query_sql.password": lambda raw, v: raw["storage"].update(query_sql={"password": v}),
    "services[0] sql source password": lambda raw, v: raw["services"][0]["sources"].update(predictions={
        "kind": "sql", "url": "postgresql+psycopg://tw@db/logs", "table": "p", "cursor_column": "id",
        "password": v}),
    "alerts.slack.token": lambda raw, v: raw.update(alerts={"slack": {"token": v, "channel": "#a"}}),
    "alerts.slack.webhook_url": lambda raw, v: raw.update(alerts={"slack": {"webhook_url": v}}),
    "alerts.alertmanager.bearer_token": lambda raw, v: raw.update(alerts={"alertmanager": {
        "urls": ["http://am:9093"], "bearer_token": v}}),
    "alerts.alertmanager.basic_auth.password": lambda raw, v: raw.update(alerts={"alertmanager": {
        "urls": ["http://am:9093"], "basic_auth": {"username": "tw", "password": v}}}),
    "ui.silence_token": lambda raw, v: raw.update(ui={"silence_token": v}),
    "daemon.redact": lambda raw, v: raw.update(daemon={"redact": [v]}),
}
# What a user writes instead of {env: NAME} or {file: PATH}: the value inline, in a list, under another key,
# as a flow mapping's key (`token: {xoxb-...}`), as the variable's name, in a list under env or file.
FORMS = {
    "inline": CANARY, "list": [CANARY], "value key": {"value": CANARY}, "as a key": {CANARY: None},
    "env holds the value": {"env": CANARY}, "env list": {"env": [CANARY]}, "file list": {"file": [CANARY]},
}
URLS = {  # a bad URL -> where it goes
    "storage url password": ("storage.url", f"postgresql+psycopg://tw:{URL_CANARY}@db/tw"),
    "storage url query password": ("storage.url", f"postgresql+psycopg://tw@db/tw?password={URL_CANARY}"),
    "storage url unparsable": ("storage.url", f"postgresql+psycopg://tw:{URL_CANARY}@db:port/tw"),
    "sql source url password": ("source.url", f"postgresql+psycopg://tw:{URL_CANARY}@db/logs"),
    "sql source url query password": ("source.url", f"postgresql://tw@db/logs?sslpassword={URL_CANARY}"),
    "alertmanager url password": ("alertmanager.urls", f"https://tw:{URL_CANARY}@am:9093"),
    "alertmanager url token": ("alertmanager.urls", f"https://{URL_CANARY}@am:9093/"),
    "alertmanager runbook url password": ("alertmanager.runbook_url", f"https://tw:{URL_CANARY}@wiki/{{alertname}}"),
    "slack base url token": ("slack.base_url", f"https://{URL_CANARY}@slack.example/api/"),
    "ui external url password": ("ui.external_url", f"https://tw:{URL_CANARY}@watch.example/ui/"),
}


def forms(value: str) -> set[str]:
    return {value, quote(value, safe=""), quote_plus(value)}


def echoed(output: str, value: str) -> bool:
    """Whether `output` holds `value` (plain or URL-quoted), also across a line wrapped by the console."""
    joined = "".join(output.split())
    return any(f in output or f in joined for f in forms(value))


def base_config(tmp_path: Path) -> dict:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    return {"storage": {"url": f"sqlite:///{tmp_path / 'tw.db'}"},
            "services": [{"name": "s", "sources": {"predictions": {"kind": "files", "path": str(logs)}}}]}


def run_cli(tmp_path: Path, raw: dict, *args: str) -> tuple[int, str]:
    path = tmp_path / "tailwatch.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    result = CliRunner().invoke(app, ["-c", str(path), *args], catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize("where", list(SECRETS))
def test_a_secret_written_in_the_config_is_refused_and_never_printed(tmp_path, where, record_property):
    tried = 0
    for form, value in FORMS.items():
        raw = base_config(tmp_path)
        SECRETS[where](raw, copy.deepcopy(value))
        commands = [("check-logs",)] + ([("db", "upgrade")] if where.startswith("storage.") else [])
        for command in commands:
            code, output = run_cli(tmp_path, raw, *command)
            assert code == 2, (form, command, output)
            assert not echoed(output, CANARY), (form, command, output)
            # It names the field and says how to pass a secret.
            field = where.split(" ")[0].replace(".redact", ".redact[0]")
            assert field in output or "sources.predictions.password" in output, (form, output)
            assert "env" in output and "file" in output, (form, output)
            tried += 1
        # Pydantic's own rendering of the error (a traceback, a log line) does not show the input either.
        with pytest.raises(ValidationError) as caught:
            Config.model_validate(raw)
        assert not echoed(f"{caught.value}\n{caught.value!r}", CANARY), form
    record_property("rel_inputs", tried)


@pytest.mark.parametrize("case", list(URLS))
def test_credentials_on_a_url_are_refused_and_never_printed(tmp_path, case, record_property):
    where, url = URLS[case]
    raw = base_config(tmp_path)
    if where == "storage.url":
        raw["storage"]["url"] = url
    elif where == "source.url":
        SECRETS["services[0] sql source password"](raw, {"env": "TW_SOURCE_PASSWORD"})
        raw["services"][0]["sources"]["predictions"]["url"] = url
    elif where == "alertmanager.runbook_url":
        raw["alerts"] = {"alertmanager": {"urls": ["http://am-1:9093"], "runbook_url": url}}
    elif where == "slack.base_url":
        raw["alerts"] = {"slack": {"token": {"env": "TW_SLACK_TOKEN"}, "channel": "#a", "base_url": url}}
    elif where == "ui.external_url":
        raw["ui"] = {"external_url": url}
    else:
        raw["alerts"] = {"alertmanager": {"urls": ["http://am-1:9093", url]}}
    commands = [("check-logs",)] + ([("db", "upgrade")] if where == "storage.url" else [])
    for command in commands:
        code, output = run_cli(tmp_path, raw, *command)
        assert code == 2, (command, output)
        assert not echoed(output, URL_CANARY), (command, output)
        assert where.split(".")[-1] in output, output
    with pytest.raises(ValidationError) as caught:
        Config.model_validate(raw)
    assert not echoed(f"{caught.value}\n{caught.value!r}", URL_CANARY)
    record_property("rel_inputs", len(commands))


def test_a_secret_file_others_could_replace_is_warned_about(tmp_path, record_property):
    secret = tmp_path / "slack-token"
    secret.write_text(CANARY + "\n")
    raw = base_config(tmp_path)
    raw["alerts"] = {"slack": {"token": {"file": str(secret)}, "channel": "#alerts"}}
    cases = [(0o600, None, []), (0o620, None, ["writable by group or others"]),
             (0o602, None, ["writable by group or others"])]
    if os.getuid() == 0:  # only root can give a file to another user
        cases += [(0o600, 10001, ["owned by uid 10001"]), (0o640, 10001, ["owned by uid 10001"]),
                  (0o660, 10001, ["writable by group or others", "owned by uid 10001"])]
    for mode, owner, expected in cases:
        secret.chmod(mode)
        os.chown(secret, os.getuid() if owner is None else owner, os.getgid())
        warnings = [w for w in Config.model_validate(raw, context={"base_dir": tmp_path}).warnings()]
        assert len(warnings) == len(expected) and all(e in w for e, w in zip(expected, warnings, strict=True)), \
            (oct(mode), owner, warnings)
        assert all(str(secret) in w and not echoed(w, CANARY) for w in warnings)
        # The command line prints them (a warning does not stop it), without the value.
        _, output = run_cli(tmp_path, raw, "check-logs")
        assert all(e in " ".join(output.split()) for e in expected) and not echoed(output, CANARY), output
    record_property("rel_inputs", len(cases))


@pytest.mark.parametrize("line", [f"    token: {CANARY}: 1", f'    token: "{CANARY}', f"    token: [{CANARY}",
                                  f"    token: {{env: {CANARY}"])
def test_a_secret_on_a_broken_yaml_line_is_not_quoted(tmp_path, line, record_property):
    path = tmp_path / "tailwatch.yaml"
    path.write_text(f"services: []\nalerts:\n  slack:\n{line}\n    channel: '#a'\n")
    output = CliRunner().invoke(app, ["-c", str(path), "check-logs"], catch_exceptions=False).output
    assert "not valid YAML" in output and "line " in output, output
    assert not echoed(output, CANARY), output
    record_property("rel_inputs", 1)
