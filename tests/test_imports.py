"""The import graph of the project's own modules: no loops (imports inside functions count too), every
import runs down the layers (the folders are the pipeline), and the pure checks stay light (no database,
YAML or config layer under them)."""

from __future__ import annotations

import ast
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("monitor", "checks", "storage")

# The layers, bottom first: a module imports only modules of its own layer or of layers below it. A module
# belongs to the layer of the longest name here that it starts with.
LAYERS = (
    ("storage",),  # models, migrations, the store: no ORM outside
    # domain types, and the release of freed memory (monitor.memory)
    ("monitor", "monitor.schema", "monitor.durations", "monitor.classes", "monitor.contract", "monitor.memory"),
    ("monitor.aggregate",),  # sketch, partial, fold, keys, reference profile
    ("checks",),  # pure window checks, quality metrics, SLO rules, the registry
    ("monitor.config",),  # the user's config, validated against the check registry and the SLO grammar
    ("monitor.ingest",),  # sources, the contract, the join
    ("monitor.verdicts",),  # windows scored against baselines, label quality, the verdict
    ("monitor.alerts",),
    ("monitor.notify",),
    ("monitor.investigate",),
    ("monitor.simulate",),
    ("monitor.daemon",),
    ("monitor.ui",),  # the web pages over the investigation layer
    ("monitor.cli", "monitor.demo"),  # the faces: nothing imports them
)


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
    assert "monitor.schema" in graph["monitor.config.fields"] and "monitor.aggregate.partial" in graph["checks.base"]


def test_no_import_loop():
    try:
        order = list(TopologicalSorter(import_graph()).static_order())
    except CycleError as exc:
        raise AssertionError(f"import loop: {' -> '.join(exc.args[1])}") from None
    assert order.index("monitor.schema") < order.index("monitor.config") < order.index("monitor.cli")


def layer_of(module: str) -> int:
    """The index in LAYERS of `module`'s layer; KeyError for a module no layer names."""
    best = max((name for layer in LAYERS for name in layer if module == name or module.startswith(name + ".")),
               key=len, default=None)
    if best is None:
        raise KeyError(f"{module} is in no layer of LAYERS: add it where its imports put it")
    return next(i for i, layer in enumerate(LAYERS) if best in layer)


def back_imports(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` for every import of a module from a higher layer."""
    return sorted(f"{a} -> {b}" for a, deps in graph.items() for b in deps if layer_of(b) > layer_of(a))


def test_imports_run_down_the_layers():
    graph = import_graph()
    assert back_imports(graph) == []
    def cli(name: str) -> bool:
        return name == "monitor.cli" or name.startswith("monitor.cli.")

    # Inside the cli package its modules import each other; from outside nothing imports any of them.
    assert not [a for a, deps in graph.items() if not cli(a) and any(map(cli, deps))], \
        "nothing imports the command line"


def test_a_back_import_is_caught():
    graph = {name: set(deps) for name, deps in import_graph().items()}
    graph["monitor.ingest.sources"].add("monitor.verdicts.windows")
    assert back_imports(graph) == ["monitor.ingest.sources -> monitor.verdicts.windows"]


def test_checks_import_no_database_yaml_or_config():
    code = ("import sys, checks, checks.evaluate, checks.quality, checks.judge, checks.thresholds\n"
            "heavy = ('sqlalchemy', 'alembic', 'yaml', 'monitor.config', 'storage.store', 'apscheduler')\n"
            "print(','.join(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import checks loaded {out.stdout.strip()}"
