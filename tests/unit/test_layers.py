"""The import direction of shared/DESIGN.md, checked by walking the source (nothing imported).

Every module under src/aisched is parsed with `ast`; every `import` and `from ... import` of
`aisched.*` is collected, relative ones resolved, including imports inside functions and under
`TYPE_CHECKING` (a type-only import obeys the same rule: it may close a cycle inside its own
layer, never point upwards). A package may import itself and the layers listed for it.

Also: `model` imports only the standard library; `core` only the standard library and numpy,
and none of the modules that would make it impure (clock, randomness, files, sockets,
processes); pydantic is used only at the edges.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = SRC / "aisched"

# Layer -> the layers it may import (itself always included). `root` is `aisched/__init__.py`
# (the version string): anyone may import it, and it imports nothing of ours.
ALLOWED: dict[str, frozenset[str]] = {
    "root": frozenset(),
    "model": frozenset(),
    "core": frozenset({"model"}),
    "lifecycle": frozenset({"core", "model"}),
    "predict": frozenset({"lifecycle", "core", "model"}),
    "store": frozenset({"lifecycle", "core", "model"}),
    "executors": frozenset({"lifecycle", "core", "model"}),
    "spec": frozenset({"core", "model"}),
    "sim": frozenset({"spec", "executors", "predict", "lifecycle", "core", "model"}),
    "service": frozenset({"store", "executors", "predict", "spec", "lifecycle", "core", "model"}),
    "testing": frozenset({"spec", "executors", "lifecycle", "core", "model"}),
    "cli": frozenset(
        {
            "service",
            "sim",
            "store",
            "executors",
            "predict",
            "spec",
            "testing",
            "lifecycle",
            "core",
            "model",
        }
    ),
}
# Finer rules: (importing layer, imported layer) -> the only modules of it allowed.
ONLY: dict[tuple[str, str], tuple[str, ...]] = {
    ("sim", "executors"): ("aisched.executors.base",),
}
# Modules that are not in a subpackage but belong to a layer.
MODULE_LAYER = {"aisched": "root", "aisched.__main__": "cli"}

CORE_THIRD_PARTY = frozenset({"numpy"})
# What would make the core impure: a clock, unseeded randomness, ids, files, sockets, processes.
CORE_FORBIDDEN = frozenset(
    {
        "time", "random", "uuid", "os", "socket", "subprocess", "pathlib", "io", "datetime",
        "secrets", "tempfile", "shutil", "threading", "multiprocessing", "asyncio", "sqlite3",
    }
)  # fmt: skip
PYDANTIC_LAYERS = frozenset({"spec", "service", "cli"})
# Layers held to the core's purity: what happens to a job between decisions is pure too.
PURE_LAYERS = frozenset({"core", "lifecycle"})


@dataclass(frozen=True, slots=True)
class Import:
    target: str  # absolute dotted name: a module, or a name in one (`pkg.mod.name`)
    line: int
    type_checking: bool


def resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of `from <level dots><name> import ...` written in `module`."""
    if level == 0:
        assert name is not None
        return name
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    if level - 1 > len(base) - 1:
        raise ValueError(f"{module}: relative import beyond the top-level package")
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every import in `source`, wherever it stands (module level, functions, classes, ifs)."""
    tree = ast.parse(source)
    out: list[Import] = []

    def visit(node: ast.AST, tc: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, tc)
            return
        if isinstance(node, ast.Import):
            out.extend(Import(a.name, node.lineno, tc) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = resolve(module, is_package, node.level, node.module)
            if base == "__future__":
                return
            # `from pkg import x` is read as importing `pkg.x`: x may be a submodule (which
            # is what counts), and if it is an attribute the prefix `pkg` still decides.
            out.extend(
                Import(base if a.name == "*" else f"{base}.{a.name}", node.lineno, tc)
                for a in node.names
            )
        for child in ast.iter_child_nodes(node):
            visit(child, tc)

    visit(tree, False)
    return out


def module_layer(module: str) -> str:
    """The layer of a module of ours: its subpackage (`aisched.core.x` is in `core`)."""
    if module in MODULE_LAYER:
        return MODULE_LAYER[module]
    return module.split(".")[1]


def target_layer(name: str) -> str | None:
    """The layer an imported name belongs to; None when it is not ours."""
    parts = name.split(".")
    if parts[0] != "aisched":
        return None
    if len(parts) == 1:
        return "root"
    head = ".".join(parts[:2])
    if head in MODULE_LAYER:
        return MODULE_LAYER[head]
    if parts[1] in ALLOWED or (PKG / parts[1]).is_dir() or (PKG / f"{parts[1]}.py").is_file():
        return parts[1]
    return "root"  # a name defined in aisched/__init__.py, such as __version__


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """Everything wrong with the imports of one module, as readable lines."""
    me = module_layer(module)
    if me not in ALLOWED:
        return [f"{module}: package {me!r} has no layer; add it to ALLOWED in this test"]
    problems: list[str] = []
    for imp in imports_of(source, module, is_package):
        where = f"{module}:{imp.line}"
        top = imp.target.split(".")[0]
        theirs = target_layer(imp.target)
        if theirs is not None:
            if theirs == me or theirs == "root" and me != "root":
                continue
            if theirs not in ALLOWED[me]:
                kind = "type-only import" if imp.type_checking else "import"
                problems.append(f"{where}: {me} may not {kind} {imp.target} ({theirs})")
                continue
            only = ONLY.get((me, theirs))
            if only and not any(imp.target == m or imp.target.startswith(m + ".") for m in only):
                problems.append(
                    f"{where}: {me} may import only {', '.join(only)} of {theirs}, not {imp.target}"
                )
            continue
        stdlib = top in sys.stdlib_module_names
        if me == "model" and not stdlib:
            problems.append(f"{where}: model may import only the standard library, not {top}")
        if me in PURE_LAYERS:
            if not stdlib and top not in CORE_THIRD_PARTY:
                problems.append(f"{where}: {me} may import only stdlib and numpy, not {top}")
            if top in CORE_FORBIDDEN:
                problems.append(f"{where}: {me} must stay pure, but imports {top}")
            if imp.target.startswith("numpy.random"):
                problems.append(f"{where}: {me} must not draw random numbers (numpy.random)")
        if top == "pydantic" and me not in PYDANTIC_LAYERS:
            problems.append(f"{where}: pydantic belongs to the edges, not to {me}")
    if me in PURE_LAYERS:
        problems.extend(
            f"{module}:{line}: {me} must not draw random numbers (np.random)"
            for line in _numpy_random_uses(source)
        )
    return problems


def _numpy_random_uses(source: str) -> list[int]:
    """Lines that touch `np.random` / `numpy.random` (unseeded randomness in the core)."""
    return [
        n.lineno
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Attribute)
        and n.attr == "random"
        and isinstance(n.value, ast.Name)
        and n.value.id in ("np", "numpy")
    ]


def modules() -> list[tuple[str, Path, bool]]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("")
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out.append((".".join(parts), path, is_package))
    return out


MODULES = modules()


def test_the_walk_sees_the_package() -> None:
    names = {m for m, _, _ in MODULES}
    assert {"aisched", "aisched.core.cycle", "aisched.model.job"} <= names
    imports = imports_of(
        (PKG / "core" / "cycle.py").read_text(), "aisched.core.cycle", is_package=False
    )
    assert any(i.target.startswith("aisched.core.session") for i in imports)


@pytest.mark.parametrize(("module", "path", "is_package"), MODULES, ids=[m for m, _, _ in MODULES])
def test_imports_point_downwards(module: str, path: Path, is_package: bool) -> None:
    assert violations(path.read_text(encoding="utf-8"), module, is_package) == []


# --- the walker itself: it must find what it is meant to find --------------------------------

SELF_CHECKS = [
    ("aisched.core.fake", False, "from aisched.cli import main\n", ["core may not import"]),
    (
        "aisched.core.plugins.fake",
        False,
        "def f():\n    from ...sim.engine import simulate\n",
        ["core may not import aisched.sim.engine"],
    ),
    (
        "aisched.core.fake",
        False,
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from aisched.service import x\n",
        ["core may not type-only import aisched.service"],
    ),
    ("aisched.model.fake", False, "import numpy as np\n", ["model may import only"]),
    ("aisched.model.fake", False, "from aisched.core.cycle import run_cycle\n", ["model may not"]),
    ("aisched.core.fake", False, "import time\n", ["core must stay pure"]),
    ("aisched.lifecycle.fake", False, "import time\n", ["lifecycle must stay pure"]),
    ("aisched.lifecycle.fake", False, "from aisched.sim import engine\n", ["lifecycle may not"]),
    ("aisched.core.fake", False, "from aisched.lifecycle import states\n", ["core may not"]),
    ("aisched.lifecycle.fake", False, "from aisched.core.cycle import run_cycle\n", []),
    ("aisched.core.fake", False, "import os.path\n", ["core must stay pure"]),
    ("aisched.core.fake", False, "import yaml\n", ["core may import only stdlib and numpy"]),
    (
        "aisched.core.fake",
        False,
        "import numpy as np\nx = np.random.rand()\n",
        ["core must not draw random numbers"],
    ),
    ("aisched.sim.fake", False, "from aisched.executors.local import X\n", ["may import only"]),
    ("aisched.sim.fake", False, "from aisched.service.loop import X\n", ["sim may not import"]),
    ("aisched.sim.traces.fake", False, "import pydantic\n", ["pydantic belongs to the edges"]),
    ("aisched", True, "from aisched.core import cycle\n", ["root may not import"]),
    ("aisched.fake", False, "import os\n", ["has no layer"]),
    ("aisched.store", True, "from .. import cli\n", ["store may not import aisched.cli"]),
    ("aisched.nothere.fake", False, "import os\n", ["has no layer"]),
    # Allowed: same layer, lower layers, executors.base from sim, stdlib, the version string.
    ("aisched.sim.fake", False, "from aisched.executors.base import Executor\n", []),
    ("aisched.sim.fake", False, "from aisched.executors import base\n", []),
    ("aisched.core.fake", False, "from . import session\nfrom ..model import job\n", []),
    ("aisched.cli.fake", False, "from aisched import __version__\nimport pydantic\n", []),
    ("aisched.core.fake", False, "import numpy as np\nimport bisect\n", []),
]


@pytest.mark.parametrize(
    ("module", "is_package", "source", "want"),
    SELF_CHECKS,
    ids=[f"{m}: {s.strip().splitlines()[-1].strip()}" for m, _, s, _ in SELF_CHECKS],
)
def test_the_walker_detects_violations(
    module: str, is_package: bool, source: str, want: list[str]
) -> None:
    got = violations(source, module, is_package)
    assert len(got) == len(want), got
    for line, fragment in zip(got, want, strict=True):
        assert fragment in line, got


def test_relative_imports_resolve() -> None:
    assert resolve("aisched.core.plugins.score", False, 1, "order") == "aisched.core.plugins.order"
    assert resolve("aisched.core.plugins.score", False, 2, "session") == "aisched.core.session"
    assert resolve("aisched.core", True, 1, "cycle") == "aisched.core.cycle"
    assert resolve("aisched.core", True, 2, None) == "aisched"
    assert resolve("aisched.core.cycle", False, 0, "numpy") == "numpy"


# --- no import cycle inside a pure layer ---------------------------------------------------


def runtime_graph(layers: frozenset[str]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports when run (type-only imports left out), for the
    modules of `layers`; an imported name is resolved to the longest module that holds it."""
    names = {m for m, _, _ in MODULES}
    graph: dict[str, set[str]] = {}
    for module, path, is_package in MODULES:
        if module_layer(module) not in layers:
            continue
        edges: set[str] = set()
        for imp in imports_of(path.read_text(encoding="utf-8"), module, is_package):
            if imp.type_checking:
                continue
            parts = imp.target.split(".")
            while parts and ".".join(parts) not in names:
                parts.pop()
            target = ".".join(parts)
            if target and target != module and module_layer(target) in layers:
                edges.add(target)
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` as [a, b, ..., a], or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str]:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return [*path[path.index(n) :], n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return []

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return []


def test_the_pure_layers_have_no_import_cycle() -> None:
    # A cycle there used to be hidden behind imports inside functions (session -> policy ->
    # registry -> actions -> queues -> session); any import made when run counts.
    assert find_cycle(runtime_graph(PURE_LAYERS)) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    graph = runtime_graph(PURE_LAYERS)
    assert "aisched.core.registry" in graph["aisched.core.policy"]
