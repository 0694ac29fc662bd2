"""The churn classifier the simulated service serves, trained once per process on Telco Customer Churn.

Inputs: tenure, MonthlyCharges, Contract, InternetService. Stratified 60/20/20 split by customer; the
scaler and encoders are fit on the training part only; the decision threshold maximises F1 of "Yes" on
the validation part. Serving scores with plain numpy from the exported coefficients.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import OneHotEncoder, StandardScaler

NUMERIC = ("tenure", "MonthlyCharges")
CATEGORICAL = ("Contract", "InternetService")
FEATURES = NUMERIC + CATEGORICAL
SPLIT_SEED = 20261102  # the split and the model do not depend on the simulation seed


@dataclass(frozen=True)
class DataDefects:
    """What was wrong with the raw CSV and what was done about it (counts of rows)."""

    rows: int
    blank_total_charges: int  # TotalCharges is " " for tenure-0 customers; set to 0.0 (not a model input)
    duplicate_customers: int  # dropped, keeping the first
    missing_inputs: int  # rows with an empty model input; dropped (none in the published file)


@dataclass(frozen=True)
class ChurnModel:
    """Logistic regression exported as arrays; categories are integer codes into `categories[name]`."""

    mean: np.ndarray  # (2,) scaler mean of tenure, MonthlyCharges
    scale: np.ndarray  # (2,)
    coef_num: np.ndarray  # (2,)
    coef_cat: tuple[np.ndarray, ...]  # one array per categorical, indexed by code
    intercept: float
    categories: dict[str, tuple[str, ...]]
    threshold: float
    base_rate: float  # share of "Yes" in the training part
    train_max: dict[str, float]
    train_min: dict[str, float]

    def logit(self, tenure: np.ndarray, charges: np.ndarray, contract: np.ndarray,
              internet: np.ndarray) -> np.ndarray:
        """Log-odds of churn. A code of -1 (unseen or missing category) contributes nothing,
        like OneHotEncoder(handle_unknown="ignore")."""
        z = self.intercept + self.coef_num[0] * (tenure - self.mean[0]) / self.scale[0]
        z = z + self.coef_num[1] * (charges - self.mean[1]) / self.scale[1]
        for codes, coef in zip((contract, internet), self.coef_cat, strict=True):
            z = z + np.where(codes >= 0, coef[np.clip(codes, 0, None)], 0.0)
        return z

    def score(self, tenure, charges, contract, internet) -> np.ndarray:
        """Probability of churn ("Yes"), 0..1."""
        return 1.0 / (1.0 + np.exp(-self.logit(tenure, charges, contract, internet)))

    def codes(self, name: str, values) -> np.ndarray:
        """Integer codes of category strings; -1 for unseen or missing."""
        cats = self.categories[name]
        lookup = {c: i for i, c in enumerate(cats)}
        return np.fromiter((lookup.get(v, -1) for v in values), dtype=np.int64, count=len(values))


@dataclass(frozen=True)
class Trained:
    model: ChurnModel
    train: pd.DataFrame
    valid: pd.DataFrame  # the reference part
    test: pd.DataFrame  # the held-out customers the simulator samples from
    defects: DataDefects


def load_telco() -> tuple[pd.DataFrame, DataDefects]:
    """The raw CSV shipped as package data, cleaned of its known defects (see DataDefects)."""
    path = resources.files("monitor.simulate") / "data" / "Telco-Customer-Churn.csv"
    with resources.as_file(path) as p:
        raw = pd.read_csv(p, dtype={"TotalCharges": str})
    n = len(raw)
    for col in ("customerID", "Contract", "InternetService", "Churn"):
        raw[col] = raw[col].astype(str).str.strip()
    total = pd.to_numeric(raw["TotalCharges"].str.strip().replace("", np.nan), errors="coerce")
    blank = int(total.isna().sum())
    raw["TotalCharges"] = total.fillna(0.0)  # blank only where tenure == 0: nothing billed yet
    dup = raw["customerID"].duplicated()
    raw = raw[~dup]
    bad = raw[list(FEATURES)].isna().any(axis=1) | (raw[list(CATEGORICAL)] == "").any(axis=1)
    raw = raw[~bad].reset_index(drop=True)
    return raw, DataDefects(rows=n, blank_total_charges=blank, duplicate_customers=int(dup.sum()),
                            missing_inputs=int(bad.sum()))


def best_threshold(y: np.ndarray, scores: np.ndarray) -> float:
    """The threshold on a 0.005 grid that maximises F1 of the positive class (ties: the lowest)."""
    grid = np.round(np.arange(0.05, 0.951, 0.005), 3)
    f1s = [f1_score(y, (scores >= t).astype(int), zero_division=0) for t in grid]
    return float(grid[int(np.argmax(f1s))])


@lru_cache(maxsize=1)
def train() -> Trained:
    """Train once per process; deterministic (fixed split seed, lbfgs)."""
    data, defects = load_telco()
    y = (data["Churn"] == "Yes").astype(int).to_numpy()
    idx = np.arange(len(data))
    tr, rest = train_test_split(idx, test_size=0.4, stratify=y, random_state=SPLIT_SEED)
    va, te = train_test_split(rest, test_size=0.5, stratify=y[rest], random_state=SPLIT_SEED)
    train_df, valid_df, test_df = (data.iloc[np.sort(s)].reset_index(drop=True) for s in (tr, va, te))

    scaler = StandardScaler().fit(train_df[list(NUMERIC)].to_numpy(float))
    enc = OneHotEncoder(handle_unknown="ignore", sparse_output=False).fit(train_df[list(CATEGORICAL)])

    def design(df: pd.DataFrame) -> np.ndarray:
        return np.hstack([scaler.transform(df[list(NUMERIC)].to_numpy(float)),
                          enc.transform(df[list(CATEGORICAL)])])

    ytr = (train_df["Churn"] == "Yes").to_numpy().astype(int)
    clf = LogisticRegression(C=1.0, max_iter=1000).fit(design(train_df), ytr)
    coef = clf.coef_[0]
    cats = {name: tuple(str(c) for c in enc.categories_[i]) for i, name in enumerate(CATEGORICAL)}
    n1 = len(cats["Contract"])
    model = ChurnModel(
        mean=scaler.mean_.copy(), scale=scaler.scale_.copy(), coef_num=coef[:2].copy(),
        coef_cat=(coef[2:2 + n1].copy(), coef[2 + n1:].copy()), intercept=float(clf.intercept_[0]),
        categories=cats, threshold=0.5, base_rate=float(ytr.mean()),
        train_max={c: float(train_df[c].max()) for c in NUMERIC},
        train_min={c: float(train_df[c].min()) for c in NUMERIC},
    )
    yva = (valid_df["Churn"] == "Yes").to_numpy().astype(int)
    s_va = model.score(valid_df["tenure"].to_numpy(float), valid_df["MonthlyCharges"].to_numpy(float),
                       model.codes("Contract", valid_df["Contract"].tolist()),
                       model.codes("InternetService", valid_df["InternetService"].tolist()))
    # the exported scorer must agree with sklearn's
    assert np.allclose(s_va, clf.predict_proba(design(valid_df))[:, 1], atol=1e-9)
    model = ChurnModel(**{**model.__dict__, "threshold": best_threshold(yva, s_va)})
    return Trained(model=model, train=train_df, valid=valid_df, test=test_df, defects=defects)
