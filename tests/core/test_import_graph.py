"""``sera_jax.core`` has no import cycle: its modules form a DAG (CONTRIBUTING.md's one-way dependency direction,
inside the package). Read from the source (``ast``), so an import inside a function or under ``TYPE_CHECKING``
counts too: a circle hidden from the interpreter is still a circle of dependency."""

import ast
import pathlib

CORE = pathlib.Path(__file__).resolve().parents[2] / "sera_jax" / "core"
PACKAGE = "sera_jax.core"


def package_imports(path: pathlib.Path, folder: pathlib.Path | None = None, package: str = PACKAGE) -> set[str]:
    """The modules of ``package`` (the files of ``folder``, default ``core``) that ``path`` imports, at any depth
    (``__init__`` for the package itself)."""
    folder = CORE if folder is None else folder
    modules = {p.stem for p in folder.glob("*.py")}
    depth = len(package.split("."))
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: inside the package
                base = f"{package}.{base}" if base else package
            # ``from sera_jax.core import selection``: the module; ``from sera_jax.core import x``: the package.
            names = [f"{base}.{alias.name}" if base == package and alias.name in modules else base
                     for alias in node.names]
        else:
            continue
        for name in names:
            if name == package:
                found.add("__init__")
            elif name.startswith(package + "."):
                found.add(name.split(".")[depth])
    return found - {path.stem}


def import_graph() -> dict[str, set[str]]:
    """{module: the modules of ``core`` it imports}, over every file of ``sera_jax/core``."""
    return {path.stem: package_imports(path) for path in sorted(CORE.glob("*.py"))}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or [] when it is acyclic (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once every descendant is explored
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = "open"
        path.append(node)
        for child in sorted(graph.get(node, ())):
            if state.get(child) == "open":
                return path[path.index(child):] + [child]
            if child not in state:
                cycle = visit(child)
                if cycle:
                    return cycle
        path.pop()
        state[node] = "done"
        return []

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def test_find_cycle_finds_a_planted_cycle_and_passes_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"y2"}, "y2": {"y"}}) == ["y", "y2", "y"]


def test_the_import_graph_reads_every_form_of_import(tmp_path, monkeypatch):
    for name, body in {"a": "from sera_jax.core import b\nfrom sera_jax.core.c import f\n",
                       "b": "def g():\n    from . import c\n", "c": "import sera_jax.core.a\n",
                       "d": "from sera_jax.core import f\n", "f": ""}.items():
        (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.setitem(globals(), "CORE", tmp_path)
    graph = import_graph()
    assert graph == {"a": {"b", "c"}, "b": {"c"}, "c": {"a"}, "d": {"f"}, "f": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]


def test_core_has_no_import_cycle():
    graph = import_graph()
    assert {"allocators", "selection", "success_rates"} <= set(graph)
    cycle = find_cycle(graph)
    assert not cycle, f"sera_jax.core imports in a circle: {' -> '.join(cycle)} (graph: {graph})"


def test_success_rates_builds_on_nothing_that_builds_on_it():
    """The circle this test was written for: ``allocators -> selection -> success_rates -> allocators`` (a type and
    ``pilot_allocate``, now in ``allocators``)."""
    assert import_graph()["success_rates"] <= {"allocation", "validation"}
