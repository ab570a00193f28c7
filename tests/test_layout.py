"""The layout of the tests: what several test modules share lives once, in a
helper module named for what it holds (tests/*_helpers.py) or in conftest.py,
so no test module imports another: each can change its own helpers freely."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    """The top-level names of the modules `path` imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_test_module_imports_another() -> None:
    offenders = {path.name: sorted(name for name in imported_modules(path) if name.startswith("test_"))
                 for path in sorted(TESTS.glob("test_*.py"))}
    offenders = {name: imports for name, imports in offenders.items() if imports}
    assert not offenders, (f"test modules import other test modules: {offenders}; move what they share "
                           "into a helper module (tests/*_helpers.py) or conftest.py")


# -- the package's layout ------------------------------------------------------------

PACKAGE = TESTS.parent / "linkrun"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def load_time_imports(path: Path) -> set[str]:
    """The linkrun modules `path` imports when it is loaded: its top-level
    imports, outside `if TYPE_CHECKING:` (an import in a function runs later)."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            names = [f"{target}.{alias.name}" for alias in node.names]
            found.update(name if (PACKAGE.parent / name.replace(".", "/")).with_suffix(".py").exists()
                         else target for name in names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] == "linkrun" and name != "linkrun"}


def test_no_import_circle_in_the_package() -> None:
    graph = {module_name(path): load_time_imports(path) for path in PACKAGE.rglob("*.py")}
    circles = []

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            circles.append(trail[trail.index(name):] + [name])
            return
        for imported in sorted(graph.get(name, ())):
            visit(imported, trail + [name])

    for name in sorted(graph):
        visit(name, [])
    assert not circles, f"import circles: {circles[:3]}"


def test_the_module_table_names_every_module_under_its_package() -> None:
    table = (TESTS.parent / "CONTRIBUTING.md").read_text().split("| module | its one job |")[1].split("\n\n")[0]
    package, named = "", set()
    for line in table.splitlines():
        if not line.startswith("| ") or line.startswith("|---"):
            continue
        heading = line.startswith("| **`")
        if heading:
            package = line.split("`")[1].rstrip("/")
        for name in ([] if heading else line.split("|")[1].replace("`", "").replace(",", " ").split()):
            named.add(f"{package}/{name}" if package else name)
    modules = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if path.name != "__init__.py"}
    assert sorted(modules - named) == [], "modules missing from CONTRIBUTING.md's table, or under another package"
    assert sorted(named - modules) == [], "CONTRIBUTING.md's table names modules that do not exist there"


def test_no_two_classes_share_a_name() -> None:
    """A class's name says which one it is, wherever it is read (local classes too)."""
    where: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(module_name(path))
    shared = {name: modules for name, modules in where.items() if len(modules) > 1}
    assert not shared, f"classes that share a name: {shared}"
