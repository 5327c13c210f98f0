"""No import circle among the modules of broker/, mcp_server/ and bench/, type-only ones included.

The graph is read from the source (no import runs): `import x` and `from x import y` (an edge to x and to x.y),
relative imports, and imports inside functions or under TYPE_CHECKING all count, because a helper typed against
the class that calls it is tied to it all the same (give it a narrow Protocol instead).
A package importing its own submodules (its face) is not a circle. import-linter's acyclic_siblings contract
checks each package's modules; this test also sees circles that cross packages (broker.events <-> broker.ports).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("broker", "mcp_server", "bench")


def modules(root: Path, tops: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the top packages (the k8s emulator left out)."""
    found: dict[str, Path] = {}
    for top in tops:
        for folder, _, files in os.walk(root / top):
            rel = Path(folder).relative_to(root).as_posix()
            if "/emulator" in rel or "__pycache__" in rel:
                continue
            for f in files:
                if f.endswith(".py"):
                    name = f"{rel}/{f[:-3]}".replace("/", ".")
                    found[name.removesuffix(".__init__")] = Path(folder) / f
    return found


def import_graph(mods: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of `mods` it imports anywhere in its file."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        package = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            graph[m].update(t for t in targets if t in mods and t != m)
    return graph


def _package_and_its_own(component: list[str]) -> bool:
    """Every member is a package or submodule of another member: a package's face, not a circle."""
    return all(any(o.startswith(x + ".") or x.startswith(o + ".") for o in component if o != x) for x in component)


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative), faces left out."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component: list[str] = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1 and not _package_and_its_own(component):
                    out.append(sorted(component))
    return out


def loop_through(graph: Mapping[str, set[str]], component: list[str]) -> list[str]:
    """One concrete circle inside a component, first module first and last (what a failure names)."""
    inside, first = set(component), component[0]
    came: dict[str, str] = {}
    frontier = [first]
    while frontier:
        nxt: list[str] = []
        for v in frontier:
            for w in sorted(graph[v] & inside):
                if w == first:
                    path = [v]
                    while path[-1] != first:
                        path.append(came[path[-1]])
                    return [*reversed(path), first]
                if w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    return component


def _write(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_broker_mcp_server_and_bench_import_one_way() -> None:
    graph = import_graph(modules(ROOT, TOPS))
    found = cycles(graph)
    assert not found, "import circles (type one side against a narrow Protocol):\n" + "\n".join(
        " -> ".join(loop_through(graph, c)) for c in found)


def test_a_type_only_or_function_level_import_back_is_a_circle(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/top.py": "from pkg.helper import help_me\n",
        "pkg/helper.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.top import Top\n",
        "pkg/a.py": "from . import b\n",
        "pkg/b.py": "def f():\n    from .a import x\n",
    })
    graph = import_graph(modules(tmp_path, ["pkg"]))
    assert cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.helper", "pkg.top"]]
    assert loop_through(graph, ["pkg.helper", "pkg.top"]) == ["pkg.helper", "pkg.top", "pkg.helper"]


def test_a_package_importing_its_own_submodule_is_not_a_circle(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "from pkg.face import Thing\n",
        "pkg/face.py": "import pkg\n",
        "pkg/low.py": "",
        "pkg/high.py": "from pkg import low\n",
    })
    assert cycles(import_graph(modules(tmp_path, ["pkg"]))) == []
