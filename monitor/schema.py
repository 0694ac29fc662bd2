"""The domain types every stage shares: what prediction rows hold beyond the contract's own fields."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from monitor.classes import class_name


class StrictModel(BaseModel):
    """A frozen pydantic model that refuses unknown keys: the schema and every config section. Its
    validation errors never show the input when printed (it may be a secret written inline); the config's
    error messages (monitor.config.load) quote a value only where it cannot be one."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, hide_input_in_errors=True)


FeatureKind = Literal["numeric", "categorical", "text"]


class Schema(StrictModel):
    """What the prediction rows hold beyond the contract's own fields."""

    features: dict[str, FeatureKind] = Field(default_factory=dict)
    segments: list[str] = Field(default_factory=list)
    classes: list[str] = Field(default_factory=list)
    positive_class: str | None = None
    score_columns: dict[str, str] = Field(default_factory=dict)
    signals: list[str] = Field(default_factory=list)
    # categorical features whose values are read in lower case (`Gold`, `GOLD` and `gold` are one value)
    fold_case: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _class_names(cls, raw: Any) -> Any:
        """Classes, the positive class and score_columns' keys named as labels and predictions are
        (monitor.classes); a class whose name differs from how it is written keeps its score column
        `score_<as written>`."""
        if not isinstance(raw, dict) or not isinstance(raw.get("classes", []), list):
            return raw
        written = raw.get("classes", [])
        # Only scalars are named; anything else is left for the field's own type error.
        classes = [class_name(c) if isinstance(c, str | int | float) else c for c in written]
        if any(c is None for c in classes):
            raise ValueError(f"classes: an empty or missing class name in {written}")
        if not all(isinstance(c, str) for c in classes):
            return raw
        if len(set(classes)) < len(classes):
            raise ValueError(f"classes: {written} name the same class twice (1, 1.0, \"1\" and true/True "
                             "are one class each)")
        raw = dict(raw, classes=classes)
        scores = raw.get("score_columns", {})
        if isinstance(scores, dict):
            scores = {class_name(k, classes) if isinstance(k, str | int | float) else k: v for k, v in scores.items()}
            for text, name in zip(written, classes, strict=True):
                if isinstance(text, str) and text.strip() != name:
                    scores.setdefault(name, f"score_{text.strip()}")
            raw["score_columns"] = scores
        if isinstance(raw.get("positive_class"), str | int | float):
            raw["positive_class"] = class_name(raw["positive_class"], classes)
        return raw

    @model_validator(mode="after")
    def _consistent(self) -> Schema:
        if self.positive_class is not None and self.positive_class not in self.classes:
            raise ValueError(f"positive_class {self.positive_class!r} is not one of classes {self.classes}")
        unknown = [c for c in self.score_columns if c not in self.classes]
        if unknown:
            raise ValueError(f"score_columns name classes not in classes: {unknown}")
        unfolded = [f for f in self.fold_case if self.features.get(f) != "categorical"]
        if unfolded:
            raise ValueError(f"fold_case: {unfolded} are not categorical features")
        return self

    def score_column(self, cls: str) -> str:
        """The column holding the score of class `cls` (default `score_<class>`)."""
        return self.score_columns.get(cls, f"score_{cls}")
