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
