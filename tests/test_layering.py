"""The library's layering.

1. It never imports pipeline configuration: nothing under ``mdboost/`` imports ``pipelines``
   (where the YAML schema lives) or names its config classes.
2. The import graph of ``mdboost`` and ``pipelines`` (module-level and function-level imports of
   their own modules) has no circle.
3. Its packages stand on floors, and an import never runs up: a module imports only modules on
   lower floors, or of its own package. Lowest first (:data:`FLOORS`):

   0. ``mdboost`` (the version, lazy exports), ``mdboost._io`` (atomic files, digests, locks)
   1. ``mdboost.md`` (core math), ``mdboost.boosting`` (learning), ``mdboost.data`` (datasets),
      ``mdboost.cluster`` (Dask)
   2. ``mdboost.models`` (the pool's models, drafters, content ids)
   3. ``mdboost.engine`` (generation with KV caches)
   4. ``mdboost.cache`` (the logit cache over a pool), ``mdboost.hf`` (transformers' generate)
   5. ``mdboost.ranking`` (pair scores from an opened cache)
   6. ``mdboost.tracking`` (the MLflow store), ``mdboost.validation`` (real runs of ranked pairs)
   7. ``mdboost.export`` (the pick for serving)
   8. ``mdboost.cli``, then 9. ``mdboost.__main__``
   10. ``pipelines`` (the YAML configs and the runs of ``mdboost rank | validate``)

4. An import inside a function only delays a heavy or optional dependency, and says so:
   ``# deferred: <why>`` on its line or the line above.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = sorted((ROOT / "mdboost").rglob("*.py"))
PIPELINES = sorted((ROOT / "pipelines").rglob("*.py"))
CONFIG_CLASSES = {"RankConfig", "ValidateConfig", "PoolConfig", "DataConfig", "CacheConfig", "MDConfig", "SpeedConfig",
                  "BoostingConfig", "RuleConfig", "TrackingConfig", "SourceConfig", "GenerationConfig", "HumanEvalConfig"}


def _imports(tree: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            out += [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
    return out


def test_the_walk_sees_the_library():
    assert len(LIBRARY) > 40 and ROOT / "mdboost" / "cache" / "pool_cache.py" in LIBRARY


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_pipeline_config_in_the_library(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = [m for m in _imports(tree) if m == "pipelines" or m.startswith(("pipelines.", "mdboost.config"))]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not names & CONFIG_CLASSES, f"{path.relative_to(ROOT)} uses {sorted(names & CONFIG_CLASSES)}"


def test_the_check_catches_an_import():
    tree = ast.parse("from pipelines.config import RankConfig\nimport mdboost.config\n")
    assert _imports(tree) == ["pipelines.config", "pipelines.config.RankConfig", "mdboost.config"]


# ---- the import graph: no circles, no import running up the floors --------------------------

FLOORS = [  # lowest first; a module may import only modules on lower floors (or its own package)
    ["mdboost", "mdboost._io"],  # the version and lazy exports; atomic files, digests, locks
    ["mdboost.md", "mdboost.boosting", "mdboost.data", "mdboost.cluster"],  # core math, learning, datasets, Dask
    ["mdboost.models"],  # the pool's models, drafters, content ids
    ["mdboost.engine"],  # generation with KV caches
    ["mdboost.cache", "mdboost.hf"],  # the logit cache over a pool; transformers' custom_generate
    ["mdboost.ranking"],  # pair scores from an opened cache
    ["mdboost.tracking", "mdboost.validation"],  # the MLflow store; real runs of ranked pairs
    ["mdboost.export"],  # the pick for serving
    ["mdboost.cli"],
    ["mdboost.__main__"],
    ["pipelines"],  # the YAML configs and the runs of `mdboost rank | validate`
]
DEFERRED = "# deferred:"  # the reason an import waits inside a function (a heavy or optional dependency)


def _module_names(root: Path) -> dict:
    """``{dotted name: path}`` of every module of ``mdboost`` and ``pipelines``; a package is its ``__init__``."""
    out = {}
    for path in sorted((root / "mdboost").rglob("*.py")) + sorted((root / "pipelines").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _project_imports(name: str, is_package: bool, tree: ast.AST, modules) -> list[tuple[str, ast.stmt, bool]]:
    """``(imported module, statement, inside a function)`` for every import of a module in ``modules``;
    ``from pkg import mod`` resolves to the module ``pkg.mod``, ``from mod import name`` to ``mod``."""
    package = name if is_package else name.rpartition(".")[0]
    out = []

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(up + ([child.module] if child.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in child.names]
            else:
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
                continue
            for target in dict.fromkeys(resolve(t) for t in targets):
                if target is not None and target != name:
                    out.append((target, child, in_function))

    visit(tree, False)
    return out


def import_graph(sources: dict) -> dict:
    """``{module: {imported modules}}`` over ``{dotted name: (source, is_package)}``, module-level
    and function-level imports alike."""
    return {name: {t for t, _, _ in _project_imports(name, pkg, ast.parse(src), sources)}
            for name, (src, pkg) in sources.items()}


def find_cycle(graph: dict) -> list | None:
    """One import circle ``[a, b, ..., a]``, or None (depth-first search)."""
    state, stack = {}, []

    def walk(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := walk(start)):
            return found
    return None


def floor_of(module: str, floors=FLOORS) -> tuple[int, str]:
    """``(floor, package)`` of a module: the longest declared package that holds it."""
    hits = [(len(pkg), i, pkg) for i, floor in enumerate(floors) for pkg in floor
            if module == pkg or module.startswith(pkg + ".")]
    if not hits:
        raise KeyError(f"{module} is on no floor of FLOORS")
    _, i, pkg = max(hits)
    return i, pkg


def upward_imports(graph: dict, floors=FLOORS) -> list[str]:
    """Imports of a module on a higher floor, or of another package on the same floor."""
    bad = []
    for module, targets in graph.items():
        here, own = floor_of(module, floors)
        for target in sorted(targets):
            there, other = floor_of(target, floors)
            if there > here or (there == here and other != own):
                bad.append(f"{module} (floor {here}) imports {target} (floor {there})")
    return bad


def undeclared_deferrals(source: str) -> list[int]:
    """Lines of imports inside functions without a ``# deferred: <why>`` comment: on the import,
    on the line above it, or on one of a block of imports right above it (one reason per block)."""
    lines = source.splitlines()
    inside = {stmt.lineno: stmt for node in ast.walk(ast.parse(source))
              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) for stmt in ast.walk(node)
              if isinstance(stmt, (ast.Import, ast.ImportFrom))}
    by_end = {stmt.end_lineno: stmt for stmt in inside.values()}

    def says_why(stmt) -> bool:
        while True:
            block = lines[stmt.lineno - 2: stmt.end_lineno]  # the line above, then the statement
            if any(DEFERRED in line for line in block):
                return True
            if stmt.lineno - 1 not in by_end:
                return False
            stmt = by_end[stmt.lineno - 1]

    return sorted(line for line, stmt in inside.items() if not says_why(stmt))


def _library_sources() -> dict:
    return {name: (path.read_text(), path.name == "__init__.py") for name, path in _module_names(ROOT).items()}


def test_the_library_has_no_import_circle():
    graph = import_graph(_library_sources())
    assert len(graph) > 90 and "mdboost.md.sampling" in graph["mdboost.md.verify"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_no_import_runs_up_the_floors():
    graph = import_graph(_library_sources())
    assert {floor_of(m)[1] for m in graph} == {pkg for floor in FLOORS for pkg in floor}  # every floor in use
    assert upward_imports(graph) == []


@pytest.mark.parametrize("path", LIBRARY + PIPELINES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_inside_functions_say_why(path):
    bad = undeclared_deferrals(path.read_text())
    assert not bad, f"{path.relative_to(ROOT)}: imports inside functions without '{DEFERRED} <why>' at lines {bad}"


PLANTED = {
    "mdboost": ("", True),
    "mdboost.md": ("", True),
    "mdboost.md.low": ("def f():\n    from . import high  # deferred: planted\n", False),
    "mdboost.md.high": ("from mdboost.md.low import f\n", False),
    "mdboost.cache": ("", True),
    "mdboost.cache.reader": ("import mdboost.md.low\n", False),
    "mdboost.ranking": ("", True),
    "mdboost.ranking.support": ("from mdboost.cache import reader\n", False),
}


def test_the_checks_catch_a_planted_circle_and_an_upward_import():
    graph = import_graph(PLANTED)
    assert graph["mdboost.md.low"] == {"mdboost.md.high"}  # a relative import inside a function counts
    assert graph["mdboost.ranking.support"] == {"mdboost.cache.reader"}  # `from pkg import mod` is the module
    assert find_cycle(graph) == ["mdboost.md.low", "mdboost.md.high", "mdboost.md.low"]
    assert upward_imports(graph) == []
    upward = dict(PLANTED, **{"mdboost.md.high": ("from mdboost.ranking.support import x\n", False)})
    assert upward_imports(import_graph(upward)) == ["mdboost.md.high (floor 1) imports mdboost.ranking.support (floor 5)"]
    sideways = dict(PLANTED, **{"mdboost.md.high": ("import mdboost.data\n", False), "mdboost.data": ("", False)})
    assert upward_imports(import_graph(sideways)) == ["mdboost.md.high (floor 1) imports mdboost.data (floor 1)"]
    with pytest.raises(KeyError, match="no floor"):
        floor_of("mdboost_extra.x")


def test_the_check_catches_an_import_without_its_reason():
    source = ("def f():\n    import torch  # deferred: planted\n\n\ndef g():\n    # deferred: planted\n"
              "    from mdboost import md\n    import mlflow\n\n    import yaml\n")
    assert undeclared_deferrals(source) == [10]  # the block of lines 7-8 has its reason; line 10 is apart
