"""The import graph of the project's own modules: no loops (imports inside functions count too), and the
pure checks stay light (no database, YAML or config layer under them)."""

from __future__ import annotations

import ast
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("monitor", "checks", "storage")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, anywhere in its body (a package's `__init__` aside)."""
    modules = {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "migrations" not in p.parts}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            deps.update(t for t in targets if t in modules and t != name and t not in PACKAGES)
        graph[name] = deps
    return graph


def test_the_graph_is_read():
    graph = import_graph()
    assert "monitor.schema" in graph["monitor.config"] and "monitor.partials" in graph["checks.base"]


def test_no_import_loop():
    try:
        order = list(TopologicalSorter(import_graph()).static_order())
    except CycleError as exc:
        raise AssertionError(f"import loop: {' -> '.join(exc.args[1])}") from None
    assert order.index("monitor.schema") < order.index("monitor.config") < order.index("monitor.cli")


def test_checks_import_no_database_yaml_or_config():
    code = ("import sys, checks, checks.evaluate, checks.quality, checks.judge, checks.thresholds\n"
            "heavy = ('sqlalchemy', 'alembic', 'yaml', 'monitor.config', 'storage.store', 'apscheduler')\n"
            "print(','.join(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import checks loaded {out.stdout.strip()}"
