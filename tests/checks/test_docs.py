"""docs/checks.md is what the check catalog makes of checks/docs_template.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from checks.catalog import contracts
from checks.docs import _default, render

ROOT = Path(__file__).resolve().parents[2]


def test_docs_checks_md_is_up_to_date():
    out = subprocess.run([sys.executable, "-m", "checks.docs", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_the_page_covers_every_check_with_its_unit_parameters_and_defaults():
    text = render()
    for c in contracts():
        assert f"### `{c.name}`" in text and c.unit in text, c.name
        for name, _, default, _ in c.parameters():
            assert any(line.startswith(f"| `{name}` |") and line.endswith(f"| {_default(default)} |")
                       for line in text.splitlines()), (c.name, name)
    assert "## Small or degenerate references" in text  # the prose the template keeps


def test_check_exits_1_when_the_page_is_stale(tmp_path, monkeypatch):
    from checks import docs

    stale = tmp_path / "checks.md"
    stale.write_text(render().replace("| `min_n` | integer | >= 1 | 100 |", "| `min_n` | integer | >= 1 | 99 |", 1))
    monkeypatch.setattr(docs, "TARGET", stale)
    monkeypatch.setattr(docs, "ROOT", tmp_path)
    assert docs.main(["--check"]) == 1
    assert docs.main([]) == 0 and docs.main(["--check"]) == 0
