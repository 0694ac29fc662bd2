"""The cardinality caps on tiny inline frames: which values keep their own name, what a fold makes of the rest."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd

from monitor.aggregate.cardinality import OTHER, Cardinality
from monitor.aggregate.fold import fold
from monitor.aggregate.partial import ALL, Partial


def frame(versions: list[str], **columns) -> pd.DataFrame:
    n = len(versions)
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(n)], "model_version": versions,
                         "ts": pd.Timestamp("2026-11-02T10:00Z") + pd.to_timedelta(np.arange(n), unit="s"),
                         "status": "ok", "latency_ms": 10.0, **columns})


def test_stored_values_keep_their_name_then_the_busiest_ties_by_name():
    caps = Cardinality(3, 32, 100, known=[("v-stored", ""), ("v-stored", "plan=a")])
    kept = caps.admit(frame(["z", "z", "b", "a", "c", "v-stored"]), ["plan"])
    assert kept.versions == {"v-stored", "z", "a"}
    assert caps.other["model_version"] == 2  # b and c
    # A later step of the tick finds no room: its new values fold into <other>.
    assert caps.admit(frame(["d", "a"]), []).versions == {"v-stored", "z", "a"}
    assert caps.other["model_version"] == 3
    assert caps.warning() == ("cardinality: folded into <other>: 3 model versions past limits.max_versions (3), "
                              "3 rows")


def test_under_the_caps_nothing_changes_and_nothing_is_said():
    caps = Cardinality(50, 32, 100)
    kept = caps.admit(frame(["a", "b"], plan=["x", "y"]), ["plan"])
    assert kept.versions is None and kept.stages is None and not kept.segments
    assert caps.warning() is None


def test_a_fold_counts_the_rest_in_other_and_loses_no_row():
    rows = frame(["a", "a", "b", "c", OTHER], plan=["x", "y", "z", "z", None],
                 **{"stage.model": [1.0, 2.0, np.nan, 1.0, 1.0], "stage.s1": [np.nan, 3.0, np.nan, np.nan, 4.0],
                    "stage.s2": [np.nan, 5.0, np.nan, np.nan, np.nan]})
    caps = Cardinality(1, 1, 1)
    kept = caps.admit(rows, ["plan"])
    out = fold(rows, timedelta(minutes=5), ["plan"], timed=False, kept=kept)
    every = {r.model_version: Partial.from_bytes(r.payload) for r in out if r.segment == ALL}
    assert {v: p.rows for v, p in every.items()} == {"a": 2, OTHER: 3}  # a logged `<other>` counts there too
    # Stage time past the cap adds up per request in stage.<other>: 3 + 5 ms, and 4 ms.
    assert every["a"].sketches["stage.<other>"].count == 1 and every["a"].sketches["stage.<other>"].sum == 8.0
    assert every[OTHER].sketches["stage.<other>"].sum == 4.0
    segments = sorted({r.segment for r in out if r.segment != ALL})
    assert segments == ["plan=<missing>", "plan=<other>", "plan=z"]
    assert sum(r.rows for r in out if r.segment != ALL) == len(rows)
