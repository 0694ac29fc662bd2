"""Feedback labels (thumbs up / down, ratings): quality scored without a prediction (docs/quality.md)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from monitor.classes import class_name
from monitor.schema import StrictModel


class Feedback(StrictModel):
    """Labels that are feedback on an answer, scored without a prediction: thumbs, as the share of `positive`
    labels among `positive` and `negative` ones (metric `feedback_rate`); or, with neither listed, numeric
    scores within [`min`, `max`], as their mean (metric `feedback_mean`). Other labels: `unknown_label`."""

    positive: list[str] = Field(default_factory=list)
    negative: list[str] = Field(default_factory=list)
    min: float | None = None
    max: float | None = None

    @field_validator("positive", "negative", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        """Named as labels are (monitor.classes): `1`, `true` and `" up "` match the labels that say so."""
        if not isinstance(value, list):
            return value
        return [class_name(v) if isinstance(v, str | int | float) else v for v in value]

    @model_validator(mode="after")
    def _one_kind(self) -> Feedback:
        if bool(self.positive) != bool(self.negative):
            raise ValueError("feedback: list both positive and negative labels (thumbs), or neither (numeric scores)")
        if set(self.positive) & set(self.negative):
            raise ValueError(f"feedback: {sorted(set(self.positive) & set(self.negative))} both positive and negative")
        if self.positive and (self.min is not None or self.max is not None):
            raise ValueError("feedback: min and max bound numeric scores; thumbs have positive and negative")
        if self.min is not None and self.max is not None and self.max <= self.min:
            raise ValueError(f"feedback: max {self.max} is not above min {self.min}")
        return self

    @property
    def metric(self) -> str:
        return "feedback_rate" if self.positive else "feedback_mean"

    @staticmethod
    def checked_rules(feedback: Feedback | None, rules: list) -> list:
        """`rules` with a feedback metric's class as `all`; ValueError for a rule on a metric the quality
        section does not score (a feedback metric without feedback, a class metric with it)."""
        kind = None if feedback is None else feedback.metric
        out = []
        for rule in rules:
            if rule.metric.startswith("feedback_") and rule.metric != kind:
                raise ValueError(f"quality.rules: {rule.metric} needs quality.feedback "
                                 + ("with positive and negative labels" if rule.metric == "feedback_rate"
                                    else "without positive and negative labels (numeric scores)"))
            if kind is not None and rule.metric != kind:
                raise ValueError(f"quality.rules: with quality.feedback a rule judges {kind}, not {rule.metric}")
            if kind is not None and rule.class_ not in ("all", "macro"):
                raise ValueError(f"quality.rules: {kind} has no class (class: all), not {rule.class_!r}")
            out.append(rule if kind is None else rule.model_copy(update={"class_": "all"}))
        return out
