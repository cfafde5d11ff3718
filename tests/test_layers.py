"""The layering contract of docs/architecture.md, checked over every import of every module.

Every ``import``/``from ... import`` statement anywhere in a module (module level, inside functions,
under ``if TYPE_CHECKING``, relative or absolute) and every ``importlib.import_module("literal")`` call
is an edge from the module's layer to the imported module's layer. An edge is allowed only to a layer in
``MAY_IMPORT[layer]`` (its own layer is always allowed); module-level cycles are not allowed anywhere.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# (folder, the package it installs as): datasets/ installs as hpcdl_datasets (pyproject's package-dir).
SOURCES = ((REPO / "hpcdl", "hpcdl"), (REPO / "datasets", "hpcdl_datasets"))

# Module name prefix -> layer; the longest matching prefix wins (hpcdl.train.peak is measurement, not train).
LAYER_OF_PREFIX = {
    "hpcdl": "facade",  # the package's __init__.py: the public facade (see FACADE_TARGETS)
    "hpcdl.__main__": "facade",
    "hpcdl.cli": "cli",
    "hpcdl.study": "study",
    "hpcdl.bench": "bench",
    "hpcdl.demo": "demo",
    "hpcdl.slurm": "slurm",
    "hpcdl.train": "train",
    "hpcdl.memory": "measurement",
    "hpcdl.train.peak": "measurement",
    "hpcdl.runtime": "runtime",
    "hpcdl.data": "data",
    "hpcdl.models": "models",
    "hpcdl_datasets": "datasets",
    "hpcdl.compress": "compress",
    "hpcdl.errors": "base",
    "hpcdl.metrics": "base",
    "hpcdl.units": "base",
}

_BELOW_TRAIN = {"measurement", "runtime", "data", "models", "datasets", "compress", "base"}
# Which layers each layer may import (besides itself). Siblings (study/bench/demo; data/models) may not import
# each other: what two of them share moves down. models sits above runtime: a model's footprint is measured with
# the runtime's read-only saved-tensor hook (hpcdl/models/footprint.py). slurm sits above train because a job request is
# checked against the training config it will run; train never launches jobs.
MAY_IMPORT: dict[str, set[str]] = {
    "base": set(),
    "compress": {"base"},
    "runtime": {"compress", "base"},
    "data": {"compress", "base"},
    "models": {"runtime", "compress", "base"},
    "datasets": {"data", "compress", "base"},
    "measurement": {"runtime", "data", "models", "datasets", "compress", "base"},
    "train": _BELOW_TRAIN,
    "slurm": {"train", *_BELOW_TRAIN},
    "study": {"slurm", "train", *_BELOW_TRAIN},
    "bench": {"slurm", "train", *_BELOW_TRAIN},
    "demo": {"slurm", "train", *_BELOW_TRAIN},
    "cli": {"study", "bench", "demo", "slurm", "train", *_BELOW_TRAIN},
    # The facade may import any layer, but only the modules it re-exports: checked by test_the_facade_*.
    "facade": {"cli", "study", "bench", "demo", "slurm", "train", *_BELOW_TRAIN},
}

# Known edges that break the contract, each with the reason it is still here. Delete an entry when its
# reason is gone; the test fails on an entry that no longer matches any import, so none outlives its edge.
ALLOWED_EXCEPTIONS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int


def module_files() -> dict[str, Path]:
    """Every module's dotted name -> its file."""
    modules = {}
    for folder, package in SOURCES:
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = module_files()


def facade_targets() -> dict[str, str]:
    """The facade's lazily re-exported names -> the module each comes from (its ``_LAZY`` table)."""
    tree = ast.parse(MODULES["hpcdl"].read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            table = ast.literal_eval(node.value)
            return {name: module for name, (module, _attribute) in table.items()}
    raise AssertionError("hpcdl/__init__.py has no _LAZY table")


FACADE_TARGETS = facade_targets()


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        layer = LAYER_OF_PREFIX.get(".".join(parts[:end]))
        if layer is not None:
            return layer
    return None


def _resolve(module: str, names: list[str]) -> list[str]:
    """What ``from module import names`` loads: a submodule per name that is one, else ``module`` itself.

    ``from hpcdl import X`` goes through the facade's lazy table, so it loads the module X comes from.
    """
    targets = []
    for name in names:
        if f"{module}.{name}" in MODULES:
            targets.append(f"{module}.{name}")
        elif module == "hpcdl" and name in FACADE_TARGETS:
            targets.append(FACADE_TARGETS[name])
        else:
            targets.append(module)
    return targets


def imports_of(module: str) -> list[Edge]:
    """Every import of an hpcdl module in ``module``'s file, wherever it is written."""
    path = MODULES[module]
    return imports_in(module, path.name == "__init__.py", path.read_text())


def imports_in(module: str, is_package: bool, source: str) -> list[Edge]:
    """Every import of an hpcdl module in ``source``, the text of ``module``."""
    package = module if is_package else module.rpartition(".")[0]
    edges = []
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            targets = _resolve(source, [alias.name for alias in node.names])
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            targets = [node.args[0].value]
        for target in targets:
            if target.split(".")[0] in ("hpcdl", "hpcdl_datasets"):
                edges.append(Edge(module, target, node.lineno))
    return edges


ALL_EDGES = [edge for module in MODULES for edge in imports_of(module)]


def test_every_module_has_a_layer():
    assert not [module for module in MODULES if layer_of(module) is None]
    assert set(MAY_IMPORT) == set(LAYER_OF_PREFIX.values())


def test_every_import_goes_down_the_layers():
    violations, used = [], set()
    for edge in ALL_EDGES:
        if edge.target == "hpcdl":
            continue  # `import hpcdl` (e.g. for __version__): the package root, loaded before any submodule anyway
        source, target = layer_of(edge.source), layer_of(edge.target)
        if target is None:
            violations.append(f"{edge.source}:{edge.line} imports {edge.target}, which does not exist")
        elif source != target and target not in MAY_IMPORT[source]:
            if (edge.source, edge.target) in ALLOWED_EXCEPTIONS:
                used.add((edge.source, edge.target))
                continue
            violations.append(f"{edge.source}:{edge.line} ({source}) imports {edge.target} ({target})")
    assert not violations, "imports against docs/architecture.md's layers:\n" + "\n".join(violations)
    assert not set(ALLOWED_EXCEPTIONS) - used, "allow-list entries whose import is gone: delete them"


def test_layers_form_no_cycle():
    """MAY_IMPORT itself is a DAG, so no chain of allowed imports leads back to where it began."""
    order: list[str] = []
    remaining = {layer: set(below) for layer, below in MAY_IMPORT.items()}
    while remaining:
        ready = [layer for layer, below in remaining.items() if not below - set(order)]
        assert ready, f"MAY_IMPORT has a cycle among {sorted(remaining)}"
        order += sorted(ready)
        for layer in ready:
            del remaining[layer]


def _cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    graph = defaultdict(set)
    for edge in edges:
        if edge.target in MODULES and edge.target != edge.source:
            graph[edge.source].add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(MODULES):
        if node not in index:
            visit(node)
    return components


def test_no_import_cycle_between_modules():
    edges = [edge for edge in ALL_EDGES if (edge.source, edge.target) not in ALLOWED_EXCEPTIONS]
    assert not _cycles(edges)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles([Edge("hpcdl.models.registry", "hpcdl.models.catalog", 1),
                    Edge("hpcdl.models.catalog", "hpcdl.models.registry", 1)]) == [
        ["hpcdl.models.catalog", "hpcdl.models.registry"]]


def test_the_import_walker_sees_function_level_relative_and_dynamic_imports():
    source = (
        "import importlib\n"
        "def f():\n"
        "    from ..train import config\n"
        "    from . import registry\n"
        "    from hpcdl import compressed\n"
        "    importlib.import_module('hpcdl.cli')\n"
    )
    targets = {edge.target for edge in imports_in("hpcdl.models.footprint", False, source)}
    assert targets == {"hpcdl.train.config", "hpcdl.models.registry", "hpcdl.runtime", "hpcdl.cli"}


def test_the_facade_imports_only_what_it_re_exports():
    """hpcdl/__init__.py imports nothing eagerly (so `import hpcdl` stays light) and lazily only its _LAZY
    modules, each of which exists; hpcdl/__main__.py imports only the CLI."""
    eager = [edge for edge in imports_of("hpcdl")]
    assert not eager, eager
    assert all(module in MODULES for module in FACADE_TARGETS.values())
    assert {edge.target for edge in imports_of("hpcdl.__main__")} == {"hpcdl.cli"}
    assert not [edge for edge in ALL_EDGES if edge.target == "hpcdl.__main__"]
