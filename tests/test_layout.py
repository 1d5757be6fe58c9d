"""The package's layout: its import graph has no cycle, its layers import only downwards,
and ``trio_duplex.__all__`` is public API only.

Every module under trio_duplex/ is parsed with ``ast`` (nothing is imported to build the
graph), and each import of the package by itself becomes an edge between two modules:

* relative (``from .x import y``, ``from .. import z``) and absolute (``trio_duplex...``)
  imports alike;
* wherever the import is: at module level, inside a function, or under
  ``if TYPE_CHECKING:``. A TYPE_CHECKING import never runs, but it is still a dependency
  of the design: two modules that need each other's names are one unit split over two
  files, and the guard only hides the cycle from the interpreter, not from a reader or
  from the next refactoring. So it counts, like any other import;
* ``from P import name`` is an edge to the module ``P.name`` if there is one, else to
  ``P`` itself: importing a package's ``__init__`` re-exports is importing that package
  (and, through its ``__init__``, whatever that imports);
* ``import P.Q`` is an edge to ``P.Q``; the parent packages the interpreter initialises
  on the way are not counted as dependencies;
* dynamic imports (``importlib.import_module``, engine strings such as
  ``trio_duplex.engines.echo:EchoEngine``) are not seen.

The layers are checked transitively, along every edge: a module may not reach a forbidden
module through another one either (each violation is reported with its chain).

* ``trio_duplex.core``: nothing from server, client, engines or testing, and no trio;
* ``trio_duplex.engines``: nothing from server, client or testing;
* ``trio_duplex.server``: nothing from client or testing;
* ``trio_duplex.media``: nothing from server, client, engines or testing;
* the shell's sans-IO modules (the call endpoints' HTTP, a call's SDP, client secrets and
  tokens): no trio.

A fake written from a provider's public reference imports nothing of the package at all,
and beyond the standard library only what it names (``INDEPENDENT``): the fake Twilio
(``trio_duplex.testing.twilio_provider``, docs/plans/telephony.md §7.3) is the other side of
the server's reading of Twilio, and would agree with a mistake it shared with the server's
code.

And one boundary by name: only ``trio_duplex.media._worker`` (run as a process of its own)
imports ``av``, ``aiortc``, ``aioice`` or ``pylibsrtp``. PyPI's av wheels link GPL x264 and
x265 (docs/plans/webrtc.md §0.1): importing any of these in the server's process would map
them into it. (The speech engine's workers load av through faster-whisper, in their own
processes too; that indirect import is not seen here.)

The checker's functions take the package name and the graph as arguments, so that the
self-tests at the end can prove each check fails when it should.
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio_duplex

PACKAGE = "trio_duplex"
PACKAGE_DIR = Path(trio_duplex.__file__).resolve().parent
STDLIB = frozenset(sys.stdlib_module_names)


# -- the graph ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` (both modules of the package) at ``line``."""

    source: str
    target: str
    line: int
    type_checking: bool = False
    in_function: bool = False

    def __str__(self) -> str:
        where = [f"line {self.line}"]
        if self.type_checking:
            where.append("under TYPE_CHECKING")
        if self.in_function:
            where.append("inside a function")
        return f"{self.source} -> {self.target} ({', '.join(where)})"


@dataclass
class ImportGraph:
    """The package's modules, their imports of each other, and their other imports
    (by top-level name, e.g. ``trio`` for ``import trio.lowlevel``)."""

    edges: dict[str, list[Edge]] = field(default_factory=dict)
    external: dict[str, list[tuple[str, int]]] = field(default_factory=dict)


def module_name(path: Path, package_dir: Path, package: str) -> str:
    parts = [package, *path.relative_to(package_dir).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Imports(ast.NodeVisitor):
    """Every import statement of one module, with where it stands."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.Import | ast.ImportFrom, bool, bool]] = []
        self._type_checking = 0
        self._function = 0

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append((node, self._type_checking > 0, self._function > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.found.append((node, self._type_checking > 0, self._function > 0))

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        if _is_type_checking(node.test):
            self._type_checking += 1
            for child in node.body:
                self.visit(child)
            self._type_checking -= 1
        else:
            for child in node.body:
                self.visit(child)
        for child in node.orelse:
            self.visit(child)

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._function += 1
        self.generic_visit(node)
        self._function -= 1

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function


def build_graph(package_dir: Path, package: str) -> ImportGraph:
    """Parse every module under ``package_dir`` and resolve its imports of ``package``."""
    paths = {module_name(p, package_dir, package): p for p in sorted(package_dir.rglob("*.py"))}
    graph = ImportGraph()
    unresolved: list[str] = []

    def inside(name: str) -> bool:
        return name == package or name.startswith(package + ".")

    for module, path in paths.items():
        is_package = path.name == "__init__.py"
        edges = graph.edges.setdefault(module, [])
        external = graph.external.setdefault(module, [])
        visitor = _Imports()
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        for node, type_checking, in_function in visitor.found:
            targets: list[str] = []
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if inside(alias.name):
                        targets.append(alias.name)
                    else:
                        external.append((alias.name.partition(".")[0], node.lineno))
            else:
                if node.level:
                    base = (module if is_package else module.rpartition(".")[0]).split(".")
                    if node.level > 1:
                        base = base[: -(node.level - 1)]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                if inside(target):
                    for alias in node.names:
                        submodule = f"{target}.{alias.name}"
                        targets.append(submodule if submodule in paths else target)
                else:
                    external.append((target.partition(".")[0], node.lineno))
            for target in targets:
                if target in paths:
                    edges.append(Edge(module, target, node.lineno, type_checking, in_function))
                else:
                    unresolved.append(f"{module} line {node.lineno}: {target}")
    assert not unresolved, "imports of the package that name no module:\n" + "\n".join(unresolved)
    return graph


# -- the checks -----------------------------------------------------------------------------


def find_cycles(edges: Mapping[str, Sequence[Edge]]) -> list[list[Edge]]:
    """One cycle (as its edges) for each strongly connected part of the graph that has
    one; empty when the graph is acyclic."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for e in edges.get(node, ()):
            if e.target not in index:
                connect(e.target)
                low[node] = min(low[node], low[e.target])
            elif e.target in on_stack:
                low[node] = min(low[node], index[e.target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(component)

    for node in sorted(edges):
        if node not in index:
            connect(node)

    cycles = []
    for component in components:
        members = set(component)
        start = min(component)
        # The shortest way from ``start`` back to itself, inside the component.
        came_by: dict[str, Edge] = {}
        queue = deque([start])
        closing: Edge | None = None
        while queue and closing is None:
            node = queue.popleft()
            for e in edges.get(node, ()):
                if e.target == start:
                    closing = e
                    break
                if e.target in members and e.target not in came_by:
                    came_by[e.target] = e
                    queue.append(e.target)
        if closing is None:
            continue  # a single module that does not import itself
        cycle = [closing]
        while cycle[0].source != start:
            cycle.insert(0, came_by[cycle[0].source])
        cycles.append(cycle)
    return cycles


def _paths_from(start: str, edges: Mapping[str, Sequence[Edge]]) -> Iterator[list[Edge]]:
    """The shortest chain of edges from ``start`` to each module it reaches."""
    came_by: dict[str, list[Edge]] = {start: []}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for e in edges.get(node, ()):
            if e.target not in came_by:
                came_by[e.target] = [*came_by[node], e]
                queue.append(e.target)
                yield came_by[e.target]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@dataclass(frozen=True)
class Layer:
    """Modules in ``package`` may not reach ``forbidden`` packages nor import ``external``
    top-level names (such as ``trio``), directly or through other modules."""

    package: str
    forbidden: tuple[str, ...]
    external: tuple[str, ...] = ()


def _in(*names: str) -> tuple[str, ...]:
    return tuple(f"{PACKAGE}.{name}" for name in names)


# The rooms, lowest first: each may import only the rooms below it.
#   core                         sans-IO: the session protocol
#   audio                        sans-IO: the audio codecs
#   dialects                     sans-IO: how a wire spells the core's events
#   engines                      the engine API and the built-in engines
#   cluster's store              keys, seals, lease memory, the store, its connection
#   server.config(_checks)       ServerConfig and its serve flags: on the core alone
#   server.sessions              the session shell (runners, connections, timers)
#   server.front                 the front door (listen, TLS, the HTTP router, auth)
#   cluster's node               node, relay, migration: beside the shell, called by it
#   server.server                DuplexServer: composes the wings, owns their lifetimes
#   workers, cli                 the process supervisor, the command line
_SHELL = ("server", "cluster", "workers", "cli", "client", "testing")
_STORE = tuple(f"cluster.{name}" for name in ("keys", "signed", "leases", "store", "connect"))
_NODE = tuple(f"cluster.{name}" for name in ("node", "relay", "migration", "placement"))
_SHELL_WINGS = ("server.sessions", "server.front", "server.server", *_SHELL[1:])

LAYERS = [
    Layer(f"{PACKAGE}.core", _in("audio", "dialects", "engines", *_SHELL), external=("trio",)),
    # Codecs are a sans-IO layer on the core: the shell imports them, the core never does.
    Layer(f"{PACKAGE}.audio", _in("dialects", "engines", *_SHELL), external=("trio",)),
    Layer(f"{PACKAGE}.dialects", _in("engines", *_SHELL), external=("trio",)),
    Layer(f"{PACKAGE}.engines", _in("dialects", *_SHELL)),
    *(
        Layer(f"{PACKAGE}.{store}", _in("dialects", "engines", *_SHELL[:1], *_NODE, *_SHELL[2:]))
        for store in _STORE
    ),
    *(
        Layer(f"{PACKAGE}.server.{name}", _in("audio", "dialects", "engines", *_SHELL_WINGS))
        for name in ("config", "config_checks")
    ),
    Layer(f"{PACKAGE}.server.sessions", _in("server.front", "server.server", *_SHELL[1:])),
    # A call's shell: on the session shell and the media link's contract, below the door.
    Layer(f"{PACKAGE}.server.calls", _in("server.front", "server.server", *_SHELL[1:])),
    Layer(f"{PACKAGE}.server.front", _in("server.server", *_SHELL[1:])),
    *(Layer(f"{PACKAGE}.{node}", _in("server.server", *_SHELL[2:])) for node in _NODE),
    Layer(f"{PACKAGE}.server.server", _in(*_SHELL[2:])),
    Layer(
        f"{PACKAGE}.workers",
        _in("server.server", "server.sessions", "cluster", "cli", "client", "testing"),
    ),
    # The media link and its worker: beside the shell, which uses them; on nothing of it.
    Layer(f"{PACKAGE}.media", _in("server", "client", "engines", "testing")),
    # Sans-IO parts of the shell: no trio, however reached (the call endpoints' HTTP, a
    # call's SDP, the client tokens' store).
    *(
        Layer(f"{PACKAGE}.server.{name}", (), external=("trio",))
        for name in ("front.calls", "front.client_secrets", "front.tokens", "calls.sdp")
    ),
]

# Top-level names only these modules may import (anywhere: at module level, in a function,
# under TYPE_CHECKING), and no module may reach them through another.
CONFINED = {name: (f"{PACKAGE}.media._worker",) for name in ("av", "aiortc", "aioice", "pylibsrtp")}

# Modules that import nothing of the package (not even under TYPE_CHECKING or in a
# function), and of the rest only the standard library and these top-level names.
INDEPENDENT = {
    # stdlib, websockets' asyncio client, httpx2 for the webhooks, numpy for a WAV's
    # low-pass before decimating it to 8 kHz
    f"{PACKAGE}.testing.twilio_provider": ("websockets", "httpx2", "numpy"),
}


def dependence(
    graph: ImportGraph, independent: Mapping[str, Sequence[str]], stdlib: frozenset[str]
) -> list[str]:
    """Each import of the package by an independent module, and each import of something
    neither in the standard library nor allowed it."""
    found = []
    for module, allowed in sorted(independent.items()):
        if module not in graph.edges:
            found.append(f"{module}: no such module")
            continue
        found += [f"{module} imports the package: {e}" for e in graph.edges[module]]
        found += [
            f"{module} imports {name} (line {line})"
            for name, line in graph.external[module]
            if name not in stdlib and name not in allowed
        ]
    return found


def layer_violations(graph: ImportGraph, layers: Sequence[Layer]) -> list[str]:
    found = []
    for layer in layers:
        for module in sorted(m for m in graph.edges if _within(m, layer.package)):
            chains = [[], *_paths_from(module, graph.edges)]
            for chain in chains:
                reached = chain[-1].target if chain else module
                via = "".join(f"\n    {e}" for e in chain)
                for banned in layer.forbidden:
                    if _within(reached, banned):
                        found.append(f"{module} reaches {banned}:{via}")
                for name, line in graph.external.get(reached, ()):
                    if name in layer.external:
                        found.append(f"{module} imports {name}:{via}\n    {reached} line {line}")
    return found


def confined_imports(graph: ImportGraph, confined: Mapping[str, Sequence[str]]) -> list[str]:
    """Each import of a confined name by a module not allowed it, and each module that
    reaches an allowed one through the package's imports (it would load it too)."""
    holders = {m for allowed in confined.values() for m in allowed}
    found = []
    for module in sorted(graph.edges):
        for name, line in graph.external.get(module, ()):
            if name in confined and module not in confined[name]:
                found.append(f"{module} imports {name} (line {line})")
        for chain in _paths_from(module, graph.edges):
            reached = chain[-1].target
            if reached in holders and module not in holders:
                via = "".join(f"\n    {e}" for e in chain)
                found.append(f"{module} reaches {reached}, which may import them:{via}")
    return found


def describe(cycle: Sequence[Edge]) -> str:
    return " -> ".join([cycle[0].source, *(e.target for e in cycle)]) + "".join(
        f"\n    {e}" for e in cycle
    )


# -- the package ------------------------------------------------------------------------------


def test_the_package_has_no_import_cycle() -> None:
    cycles = find_cycles(build_graph(PACKAGE_DIR, PACKAGE).edges)
    assert not cycles, "import cycles (TYPE_CHECKING imports count):\n" + "\n".join(
        describe(c) for c in cycles
    )


def test_the_layers_import_only_downwards() -> None:
    violations = layer_violations(build_graph(PACKAGE_DIR, PACKAGE), LAYERS)
    assert not violations, "layering violations:\n" + "\n".join(violations)


def test_only_the_media_worker_imports_the_media_stack() -> None:
    graph = build_graph(PACKAGE_DIR, PACKAGE)
    violations = confined_imports(graph, CONFINED)
    assert not violations, "imports of av/aiortc/aioice/pylibsrtp:\n" + "\n".join(violations)
    # (not vacuous: the worker is there and imports them)
    worker = {name for name, _ in graph.external[f"{PACKAGE}.media._worker"]}
    assert {"av", "aiortc", "aioice"} <= worker


def test_the_fakes_import_nothing_of_the_package() -> None:
    graph = build_graph(PACKAGE_DIR, PACKAGE)
    violations = dependence(graph, INDEPENDENT, STDLIB)
    assert not violations, "a fake that depends on what it tests:\n" + "\n".join(violations)
    # (not vacuous: the fake is there and imports what it says)
    fake = {name for name, _ in graph.external[f"{PACKAGE}.testing.twilio_provider"]}
    assert {"websockets", "httpx2", "hmac", "xml"} <= fake


def test_the_graph_sees_every_module_and_the_known_edges() -> None:
    """The parser is not vacuous: it finds every module and edges of each kind."""
    graph = build_graph(PACKAGE_DIR, PACKAGE)
    assert len(graph.edges) == len(list(PACKAGE_DIR.rglob("*.py")))
    targets = {(e.source, e.target) for edges in graph.edges.values() for e in edges}
    # from .server.server import DuplexServer (absolute through a relative import)
    assert (PACKAGE, f"{PACKAGE}.server.server") in targets
    # from . import client: the subpackage itself
    assert (PACKAGE, f"{PACKAGE}.client") in targets
    # from ..core.wire import ... (two levels up)
    assert (f"{PACKAGE}.engines.api", f"{PACKAGE}.core.wire") in targets
    # an import inside a function (cli's connect command)
    assert any(e.in_function for e in graph.edges[f"{PACKAGE}.cli"])
    assert "trio" in {name for name, _ in graph.external[f"{PACKAGE}.server.server"]}


# Names of the server's internals (the session table, a session, its state machine): tests
# and the simulation kit reach them by their module path, trio_duplex.core.session.
INTERNAL = {"Registry", "Session", "State"}


def test_the_package_exports_only_public_api() -> None:
    exported = set(trio_duplex.__all__)
    leaked = sorted(exported & INTERNAL)
    assert not leaked, f"internals in trio_duplex.__all__: {leaked}"
    assert all(not name.startswith("_") for name in exported), exported
    assert all(hasattr(trio_duplex, name) for name in exported), exported


# -- self-tests: each check can fail --------------------------------------------------------


def _graph(edges: Mapping[str, Sequence[str]], **external: Sequence[str]) -> ImportGraph:
    return ImportGraph(
        edges={
            source: [Edge(source, target, n + 1) for n, target in enumerate(targets)]
            for source, targets in edges.items()
        },
        external={m: [(name, 1) for name in names] for m, names in external.items()},
    )


def test_find_cycles_finds_a_cycle_and_only_a_cycle() -> None:
    acyclic = _graph({"p": ["p.a", "p.b"], "p.a": ["p.b"], "p.b": []})
    assert find_cycles(acyclic.edges) == []
    cyclic = _graph({"p": ["p.a"], "p.a": ["p.b"], "p.b": ["p.c"], "p.c": ["p.a"], "p.d": []})
    (cycle,) = find_cycles(cyclic.edges)
    assert describe(cycle).splitlines()[0] == "p.a -> p.b -> p.c -> p.a"
    (loop,) = find_cycles(_graph({"p.a": ["p.a"]}).edges)
    assert [(e.source, e.target) for e in loop] == [("p.a", "p.a")]
    two = _graph({"p.a": ["p.b"], "p.b": ["p.a"], "p.c": ["p.d"], "p.d": ["p.c"]})
    assert len(find_cycles(two.edges)) == 2


def test_layer_violations_direct_transitive_and_external() -> None:
    layers = [Layer("p.core", ("p.server",), external=("trio",))]
    clean = _graph({"p.core.a": ["p.core.b"], "p.core.b": [], "p.server": ["p.core.a"]})
    assert layer_violations(clean, layers) == []
    direct = _graph({"p.core.a": ["p.server"], "p.server": []})
    assert layer_violations(direct, layers) == [
        "p.core.a reaches p.server:\n    p.core.a -> p.server (line 1)"
    ]
    # Through the package's __init__ (a re-export), then a submodule.
    transitive = _graph({"p.core.a": ["p"], "p": ["p.server.x"], "p.server.x": []})
    (violation,) = layer_violations(transitive, layers)
    assert violation.startswith("p.core.a reaches p.server:")
    uses_trio = _graph({"p.core.a": ["p.core.b"], "p.core.b": []}, **{"p.core.b": ["trio"]})
    assert [v.splitlines()[0] for v in layer_violations(uses_trio, layers)] == [
        "p.core.a imports trio:",
        "p.core.b imports trio:",
    ]


def test_confined_imports_direct_and_through_the_package() -> None:
    confined = {"av": ("p.media._worker",), "aiortc": ("p.media._worker",)}
    clean = _graph(
        {"p.media._worker": [], "p.media.link": ["p.media.wire"], "p.media.wire": []},
        **{"p.media._worker": ["av", "aiortc", "json"], "p.media.link": ["trio"]},
    )
    assert confined_imports(clean, confined) == []
    direct = _graph({"p.server.x": [], "p.media._worker": []}, **{"p.server.x": ["av"]})
    assert confined_imports(direct, confined) == ["p.server.x imports av (line 1)"]
    # Importing the worker as a module would import aiortc and av with it.
    through = _graph(
        {"p.media.link": ["p.media._worker"], "p.media._worker": []},
        **{"p.media._worker": ["aiortc"]},
    )
    (violation,) = confined_imports(through, confined)
    assert violation.startswith("p.media.link reaches p.media._worker, which may import them:")


def test_dependence_finds_the_package_and_unnamed_imports() -> None:
    independent = {"p.testing.fake": ("websockets",)}
    stdlib = frozenset({"json", "asyncio"})
    clean = _graph({"p.testing.fake": []}, **{"p.testing.fake": ["json", "websockets"]})
    assert dependence(clean, independent, stdlib) == []
    # Any edge into the package counts, even one a TYPE_CHECKING import makes.
    edges = {"p.testing.fake": [Edge("p.testing.fake", "p.core.x", 3, type_checking=True)]}
    typed = ImportGraph(edges=edges, external={"p.testing.fake": []})
    assert dependence(typed, independent, stdlib) == [
        "p.testing.fake imports the package: "
        "p.testing.fake -> p.core.x (line 3, under TYPE_CHECKING)"
    ]
    trio_too = _graph({"p.testing.fake": []}, **{"p.testing.fake": ["trio", "asyncio"]})
    assert dependence(trio_too, independent, stdlib) == ["p.testing.fake imports trio (line 1)"]
    assert dependence(_graph({}), independent, stdlib) == ["p.testing.fake: no such module"]


def test_the_media_layer_is_checked() -> None:
    (layer,) = [x for x in LAYERS if x.package == f"{PACKAGE}.media"]
    bad = _graph(
        {f"{PACKAGE}.media.link": [f"{PACKAGE}.server.config"], f"{PACKAGE}.server.config": []}
    )
    (violation,) = layer_violations(bad, [layer])
    assert violation.startswith(f"{PACKAGE}.media.link reaches {PACKAGE}.server:")
    fine = _graph({f"{PACKAGE}.media.link": [f"{PACKAGE}.settings"], f"{PACKAGE}.settings": []})
    assert layer_violations(fine, [layer]) == []


def test_build_graph_resolves_every_kind_of_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from .a import A\nfrom . import sub\n",
        "a.py": (
            "from typing import TYPE_CHECKING\n"
            "import trio.lowlevel\n"
            "if TYPE_CHECKING:\n"
            "    from .sub.b import B\n"
            "else:\n"
            "    import json\n"
            "class A: ...\n"
        ),
        "sub/__init__.py": "from .b import B\n",
        "sub/b.py": "def f() -> None:\n    from pkg import a\n    from .. import A\n",
        "sub/c.py": "import pkg.sub.b\nfrom pkg.sub import B\nfrom ..sub import *\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = build_graph(pkg, "pkg")
    edges = {(e.source, e.target, e.line, e.type_checking, e.in_function) for e in _all(graph)}
    assert edges == {
        ("pkg", "pkg.a", 1, False, False),
        ("pkg", "pkg.sub", 2, False, False),
        ("pkg.a", "pkg.sub.b", 4, True, False),
        ("pkg.sub", "pkg.sub.b", 1, False, False),
        ("pkg.sub.b", "pkg.a", 2, False, True),
        ("pkg.sub.b", "pkg", 3, False, True),  # a re-export: the package itself
        ("pkg.sub.c", "pkg.sub.b", 1, False, False),
        ("pkg.sub.c", "pkg.sub", 2, False, False),
        ("pkg.sub.c", "pkg.sub", 3, False, False),
    }
    assert graph.external["pkg.a"] == [("typing", 1), ("trio", 2), ("json", 6)]
    cycles = {describe(c).splitlines()[0] for c in find_cycles(graph.edges)}
    assert cycles == {"pkg -> pkg.a -> pkg.sub.b -> pkg"}


def _all(graph: ImportGraph) -> Iterator[Edge]:
    for edges in graph.edges.values():
        yield from edges
