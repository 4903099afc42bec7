"""The package's import graph: no circles, and no layer importing a layer above it.

Read from the source with `ast` (nothing is imported): every `import` counts, at module level,
inside functions and under `TYPE_CHECKING` alike, since each is a dependency a reader must
follow. docs/ARCHITECTURE.md draws the same layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kvbench", "engines", "workloads", "kernels")

# Lowest first. A module belongs to the layer of the longest prefix that names it; it may import
# its own layer and the ones below, never one above.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "foundations",
        (
            "kvbench.errors", "kvbench.version", "kvbench.paper", "kvbench.flag_ranges", "kvbench.models",
            "kvbench.kvspec",
            "kvbench.requests", "kvbench.gc_pause", "kvbench.plugins", "kvbench.results", "kvbench.vmm",
            "kvbench.metrics.occupancy",
        ),
    ),
    ("workloads", ("workloads",)),
    (
        "kernels and model code",
        ("kernels", "kvbench.modeling", "kvbench.parallel.layers", "kvbench.parallel.sizes",
         "kvbench.parallel.channel", "kvbench.parallel.shard"),
    ),
    (
        "engines and their metrics",
        ("engines", "kvbench.sequence", "kvbench.runner", "kvbench.budget", "kvbench.cost_model",
         "kvbench.engine", "kvbench.metrics"),
    ),
    ("configuration", ("kvbench.config", "kvbench.flags", "kvbench.calibrate.fit")),
    (
        "running one configuration",
        ("kvbench.simulate", "kvbench.real", "kvbench.parallel", "kvbench.external", "kvbench.calibrate"),
    ),
    ("many runs and their reports", ("kvbench.sweep", "kvbench.demo", "kvbench.report")),
    ("the paper's figures", ("kvbench.reproduce",)),
    ("the command line and the public names", ("kvbench.cli", "kvbench.__main__", "kvbench")),
)  # fmt: skip


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


MODULES = modules()


def _resolve(name: str) -> str | None:
    """The kvbench module `name` refers to (a module, or the package holding a name), if any."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    """Every kvbench module `module` imports, anywhere in its source."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {t for t in map(_resolve, targets) if t and t != module}
    return found


GRAPH = {module: imports(module) for module in MODULES}


def layer(module: str) -> int:
    best, rank = "", None
    for number, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, rank = prefix, number
    assert rank is not None, f"{module} is in no layer: add it to LAYERS in {Path(__file__).name}"
    return rank


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_circles():
    assert circles(GRAPH) == []


def test_no_module_imports_a_layer_above_its_own():
    upward = [
        f"{module} ({LAYERS[layer(module)][0]}) imports {target} ({LAYERS[layer(target)][0]})"
        for module, targets in sorted(GRAPH.items())
        for target in sorted(targets)
        if layer(target) > layer(module)
    ]
    assert upward == []


def test_config_knows_nothing_of_the_external_engines():
    """They register themselves (`kvbench.plugins`), so a new one needs no edit below it."""
    below = [m for m in MODULES if layer(m) <= layer("kvbench.config")]
    assert not [m for m in below if any(t.startswith("kvbench.external") for t in GRAPH[m])]


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ],
)
def test_circles_are_found(graph, expected):
    assert circles(graph) == expected


def test_every_kind_of_import_is_read(tmp_path, monkeypatch):
    """Function-level, TYPE_CHECKING-only and relative imports all count as edges."""
    source = tmp_path / "kvbench" / "demo_probe.py"
    source.parent.mkdir()
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from kvbench.config import RunConfig\n"
        "def f():\n    import kvbench.sweep.run\n"
        "from .errors import KvbenchError\n"
    )
    monkeypatch.setitem(MODULES, "kvbench.demo_probe", source)
    assert imports("kvbench.demo_probe") == {"kvbench.config", "kvbench.sweep.run", "kvbench.errors"}


def test_the_public_names_import_from_kvbench():
    import kvbench

    assert kvbench.__version__
    assert "hf-cb" in __import__("kvbench.plugins", fromlist=["EXTERNAL"]).EXTERNAL
