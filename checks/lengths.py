"""Text lengths: the distribution of characters per text field against the reference."""

from __future__ import annotations

from checks.base import Finding
from checks.contract import check
from checks.drift import DriftThreshold, histogram_findings
from monitor.aggregate import keys
from monitor.aggregate.partial import Partial
from monitor.aggregate.profile import Profile


@check("length_distribution", DriftThreshold, "lengths", "PSI of characters per text (Jensen-Shannon distance as effect)",
       "texts")
def length_distribution(window: Partial, profile: Profile | None, baseline: Partial | None,
                        params: DriftThreshold) -> list[Finding]:
    """PSI / Jensen-Shannon / chi-square p of text length (characters) per text feature vs reference.

    Nothing without a profile.
    """
    if profile is None:
        return []
    pairs = [({"field": f}, ref, window.hists.get(keys.length(f)), keys.length(f)) for f, ref in sorted(profile.fields.items())
             if ref.kind == "text"]
    return histogram_findings("length_distribution", pairs, params, baseline)
