"""Configuration: one YAML file, validated by pydantic; secrets only by environment variable or file.

The models live in `fields` (building blocks), `service` (one watched service) and `model` (the whole
config); `load` reads and validates a file. This module hands their public names on.
"""

from monitor.config.fields import ConfigError, Duration, Secret, check_cron, expression_columns
from monitor.config.load import DEFAULT_PATH, ENV_CONFIG, example, load, load_storage, parse
from monitor.config.metrics import FAMILIES, MetricsExport
from monitor.config.model import (
    Alertmanager,
    Alerts,
    BasicAuth,
    Config,
    Daemon,
    Engine,
    Health,
    InhibitRule,
    Limits,
    NoDataAlerts,
    QuerySql,
    Retention,
    Slack,
    SlackRoute,
    Storage,
    Tier,
    VerdictAlerts,
)
from monitor.config.service import (
    Buckets,
    BurnRate,
    Compare,
    Constraint,
    FileSource,
    Join,
    Quality,
    QualityRule,
    Reference,
    Service,
    Shape,
    SloRule,
    Source,
    Sources,
    SqlSource,
    Timestamps,
)
from monitor.config.ui import Ui, incident_url, page_url
from monitor.durations import parse_duration

__all__ = [
    "DEFAULT_PATH", "ENV_CONFIG", "FAMILIES", "Alertmanager", "Alerts", "BasicAuth", "BurnRate", "Buckets", "Compare",
    "Config", "ConfigError", "Constraint", "Daemon", "Duration", "Engine", "FileSource", "Health", "InhibitRule", "Join",
    "Limits", "MetricsExport",
    "NoDataAlerts", "Quality", "QualityRule", "QuerySql", "Reference", "Retention", "Secret", "Service",
    "Shape", "Slack", "SlackRoute", "SloRule", "Source", "Sources", "SqlSource", "Storage", "Tier", "Timestamps", "Ui",
    "VerdictAlerts", "check_cron", "example", "expression_columns", "incident_url", "load", "load_storage",
    "page_url", "parse", "parse_duration",
]
