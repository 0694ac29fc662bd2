"""The storage boundary: outside `storage/`, the product's code reaches the database only through the
repositories (no SQLAlchemy, no ORM models); and every module of the repository stays short."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The product's packages besides storage/ (tests and benchmarks seed and inspect tables directly).
PRODUCT = ("monitor", "checks")
FORBIDDEN = ("sqlalchemy", "storage.models")
ALLOWED = {
    # Reads the user's own source database (a `sql` source), not tailwatch's: not our storage.
    "monitor/ingest/sources/sql.py": {"sqlalchemy"},
}
MAX_LINES = 500


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of its body (TYPE_CHECKING blocks included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def _forbidden(module: str) -> str | None:
    return next((f for f in FORBIDDEN if module == f or module.startswith(f + ".")), None)


def test_no_orm_outside_storage():
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            bad = {_forbidden(m) for m in _imports(path)} - {None} - ALLOWED.get(rel, set())
            if bad:
                found.append(f"{rel}: {sorted(bad)}")
    assert not found, "use a repository of storage/ instead:\n" + "\n".join(found)


def test_the_allowlist_is_current():
    for rel, names in ALLOWED.items():
        used = {_forbidden(m) for m in _imports(ROOT / rel)}
        assert names <= used, f"{rel} no longer imports {sorted(names - used)}: drop it from ALLOWED"


def test_the_check_sees_an_import():
    assert "sqlalchemy" in {_forbidden(m) for m in _imports(ROOT / "storage" / "database.py")}


def test_every_module_is_short():
    long = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if any(part.startswith(".") or part in ("node_modules", "__pycache__") for part in rel.parts):
            continue
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            long.append(f"{rel.as_posix()}: {lines} lines")
    assert not long, f"split these modules (at most {MAX_LINES} lines each):\n" + "\n".join(long)
