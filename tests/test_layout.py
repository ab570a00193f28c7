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


def _target(node: ast.ImportFrom | ast.Import, package: list[str]) -> set[str]:
    """The linkrun modules one import statement names (a package's module
    when it imports one by name: `from ..state import records`)."""
    if isinstance(node, ast.Import):
        found = {alias.name for alias in node.names}
    else:
        base = package[: len(package) - node.level + 1] if node.level else []
        target = ".".join(base + ([node.module] if node.module else []))
        names = [f"{target}.{alias.name}" for alias in node.names]
        found = {name if (PACKAGE.parent / name.replace(".", "/")).with_suffix(".py").exists() else target
                 for name in names}
    return {name for name in found if name.split(".")[0] == "linkrun" and name != "linkrun"}


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imports_of(path: Path, *, lazy: bool = True, typing: bool = True) -> set[str]:
    """The linkrun modules `path` imports: at load time (its top-level
    imports); with `lazy`, those inside functions too (they run later, but
    they are arrows all the same); with `typing`, those under
    `if TYPE_CHECKING:` (never run: an arrow for the reader and mypy alone)."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()

    def visit(body: list[ast.AST], top: bool) -> None:
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                if top or lazy:
                    found.update(_target(node, package))
            elif isinstance(node, ast.stmt) and _is_type_checking(node):
                if typing:
                    visit(list(node.body), top)
            elif lazy:
                visit(list(ast.iter_child_nodes(node)), False)

    visit(list(ast.parse(path.read_text(), filename=str(path)).body), True)
    return found


def load_time_imports(path: Path) -> set[str]:
    """The linkrun modules `path` imports when it is loaded: its top-level
    imports, outside `if TYPE_CHECKING:` (an import in a function runs later)."""
    return imports_of(path, lazy=False, typing=False)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    circles = []

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            circles.append(trail[trail.index(name):] + [name])
            return
        for imported in sorted(graph.get(name, ())):
            visit(imported, trail + [name])

    for name in sorted(graph):
        visit(name, [])
    return circles


def test_no_import_circle_in_the_package() -> None:
    """Lazy and type-only imports included: one in a function is an arrow all
    the same, and two modules that name each other's types are one role split
    in two (a module that only reads another's object declares a Protocol of
    what it reads instead)."""
    graph = {module_name(path): imports_of(path, typing=True) for path in PACKAGE.rglob("*.py")}
    circles = _circles(graph)
    assert not circles, f"import circles: {circles[:3]}"


MAX_LINES = 450  # a module past this holds more than one role: split it by role


def test_no_module_is_longer_than_one_role_needs() -> None:
    long = {module_name(path): lines for path in sorted(PACKAGE.rglob("*.py"))
            if (lines := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}; split each by role"


# Which package may import which: each floor imports its own and the floors
# below it, never one above (lazy and type-only imports included). Top to
# bottom; CONTRIBUTING.md says the same in one line (checked below).
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("commands", ("cli", "__main__", "up", "doctor", "sandbox_command")),  # what a person runs
    ("front", ("front",)),  # the MCP session and the tool layer
    ("calls", ("calls",)),  # serve's calls, owned below the tool layer
    ("detached", ("detached",)),  # background commands: start, the supervisor, the sweep
    ("messages", ("messages",)),  # the told message and its sending
    ("processes", ("processes",)),  # a process group run and watched, for a call and a supervisor
    ("sandboxing", ("sandboxing",)),  # the sandbox's argv, its launch, its limits
    ("network", ("network",)),  # the agent's internet
    ("state", ("state",)),  # the state folder's contract
    ("ground", ("__init__", "config", "errors", "units", "kernel", "invocation", "agent", "address", "logger")),
)

# Arrows allowed against the floors, each with its reason. Empty: add one only
# with a sentence that says why no better place exists.
UPWARD: dict[tuple[str, str], str] = {}


def floor_of(module: str) -> int:
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "__init__"
    for number, (_, members) in enumerate(FLOORS):
        if name in members:
            return number
    raise AssertionError(f"{module} is on no floor of test_layout.FLOORS: give it one")


def test_each_package_imports_only_below_it() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = module_name(path)
        for imported in sorted(imports_of(path)):
            if floor_of(imported) < floor_of(here) and (here, imported) not in UPWARD:
                upward.append(f"{here} ({FLOORS[floor_of(here)][0]}) imports {imported} "
                              f"({FLOORS[floor_of(imported)][0]})")
    assert not upward, "imports against the floors (test_layout.FLOORS):\n" + "\n".join(upward)


# The tool layer turns MCP requests into the owner of calls' requests and its
# outcomes into MCP answers: how a call runs (its sandbox, its internet) is
# below it (calls/), whatever the floors would allow.
NOT_FROM_FRONT = ("network", "sandboxing")


def test_front_imports_nothing_of_the_sandbox_or_the_internet() -> None:
    found = [f"{module_name(path)} imports {imported}" for path in sorted((PACKAGE / "front").rglob("*.py"))
             for imported in sorted(imports_of(path)) if imported.split(".")[1] in NOT_FROM_FRONT]
    assert not found, "front/ reaches below the owner of calls (calls/):\n" + "\n".join(found)


# What a module may hold that changes at run time: a memo of this process's
# own facts, each named with its reason. serve's state (its calls' leftovers,
# cgroups, spares, /etc watch, proxy) is held by the objects its owner of
# calls makes and closes (calls/caller.py), never by a module.
MODULE_STATE = {
    "logger._name": "the process's one voice, named once at its start",
    "logger._shown": "the level it shows, set with its voice",
    "logger._timed": "whether its lines lead with the time, set with its voice",
    "sandboxing.cgroups._counter": "names this process's groups",
    "sandboxing.cgroups._leaf_lock": "orders the move into the leaf below",
    "sandboxing.cgroups._in_leaf": "this process moved into its v2 leaf, once",
    "sandboxing.cgroups._swept": "a folder's orphan groups ended once a process",
    "sandboxing.etcview._prints": "a view's print, never changed once written",
    "sandboxing.etcview._STATES": "each state folder as this process first found it: one made again is not the agent's",
    "sandboxing.gitcheck._TEXTS": "a git config's text by its path and identity",
    "sandboxing.gitcheck._HOOKS_PATHS": "a config text's hooksPath, parsed once by git",
    "sandboxing.gitconfig._FIXED_VALUE": "whether git takes --fixed-value, asked once",
    "detached.outfile._renameat2": "libc's renameat2, looked up once",
}
_MUTABLE = {"set", "dict", "list", "OrderedDict", "deque", "SimpleQueue", "Queue", "Lock", "RLock", "Event",
            "Condition", "count"}


def _module_state(path: Path) -> set[str]:
    """The names a module holds that change at run time: an empty container or
    a lock, queue or counter made at load, and whatever a function declares `global`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        empty = isinstance(value, ast.Dict | ast.List | ast.Set) and not getattr(value, "keys", getattr(value, "elts", None))
        made = isinstance(value, ast.Call) and getattr(value.func, "attr", getattr(value.func, "id", "")) in _MUTABLE
        if (empty or made) and isinstance(target, ast.Name):
            names.add(target.id)
    return names


def test_no_module_holds_serves_state() -> None:
    found = {f"{module_name(path).removeprefix('linkrun.')}.{name}" for path in PACKAGE.rglob("*.py")
             for name in _module_state(path)}
    assert sorted(found - set(MODULE_STATE)) == [], "module-level state: give it to an owner, or name it in MODULE_STATE"
    assert sorted(set(MODULE_STATE) - found) == [], "MODULE_STATE names state that no module holds any more"


def test_contributing_names_the_floors_in_their_order() -> None:
    line = "Floors, top to bottom: " + " > ".join(f"`{name}`" for name, _ in FLOORS)
    assert line in (TESTS.parent / "CONTRIBUTING.md").read_text(), f"CONTRIBUTING.md should say: {line}"


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
