"""The protocol's rules are the core's: the shell builds no ``ProtocolError``, and raises
the refusals the core names only where it, not the core, observes why.

Every module of the shell (``trio_duplex.server``, the cluster's node) is parsed with
``ast``. A ``ProtocolError(...)`` call, or a call of one of its constructors
(``ProtocolError.home_unreachable(...)``), is a refusal built outside the core: there
must be none. A ``raise`` of a refusal the core built (``raise opening.X()``, ``raise
cluster.X(...)``, a function imported from ``trio_duplex.core``) must be one of
``ALLOWED``, each with what the shell alone can see: the transport (a WebSocket's
frames, the store, another node), the HTTP front door, or an engine that failed. What a
client event or an opening message *means* is decided in core/protocol.py and
core/opening.py, which raise their own refusals.
"""

from __future__ import annotations

import ast
from pathlib import Path

import trio_duplex

PACKAGE_DIR = Path(trio_duplex.__file__).resolve().parent
SHELL = ("server", *(f"cluster/{name}.py" for name in ("node", "relay", "migration", "placement")))

# (module, the core's refusal raised) -> what only the shell can see there.
ALLOWED: dict[tuple[str, str], str] = {
    ("cluster.node", "cluster.no_lease"): "the store did not grant a lease (unreachable, or "
    "this node's registration lapsed)",
    ("cluster.node", "cluster.cluster_full"): "the store's lease count is at the cap",
    ("cluster.node", "cluster.store_unreachable_for_resume"): "the store did not answer",
    ("cluster.placement", "cluster.elsewhere"): "where the store says the session lives",
    ("cluster.placement", "cluster.unreachable_home"): "the relay to the home node failed",
    ("cluster.migration", "cluster.record_unusable"): "the handed-over record read from the "
    "store does not parse or is filed wrongly",
    ("cluster.migration", "cluster.takeover_token_invalid"): "the record's digests, read from "
    "the store, do not match the token",
    ("cluster.migration", "cluster.takeover_failed"): "the engine could not restore the record",
    ("cluster.migration", "cluster.takeover_unconfirmed"): "the store did not confirm the "
    "take-over",
    ("server.sessions.opening", "engine_broke"): "the engine failed before a session existed",
    ("server.sessions.opening", "opening.CONFIG_TIMEOUT"): "no first message within "
    "--config-timeout, by the shell's clock",
    ("server.sessions.opening", "opening.other_dialect"): "the session's dialect is not its "
    "connection's (the path's): dialects are the shell's, the core sees spellings only",
    ("server.sessions.opening", "opening.ended_during_resume"): "the session's teardown "
    "(its engine task) ended it while the replay was written",
    ("server.sessions.owner", "engine_broke"): "the engine failed in prepare",
    ("server.sessions.owner", "opening.engine_not_ready"): "the engine's prepare timed out",
    ("server.sessions.owner", "opening.not_resumable"): "the session's runner has not started",
    ("server.sessions.runner", "binary_not_negotiated"): "a binary WebSocket frame on a "
    "session whose audio is not on the binary lane",
}


def shell_modules(package_dir: Path = PACKAGE_DIR) -> dict[str, ast.Module]:
    found = {}
    for entry in SHELL:
        path = package_dir / entry
        for file in [path] if path.suffix == ".py" else sorted(path.rglob("*.py")):
            name = ".".join(file.relative_to(package_dir).with_suffix("").parts)
            found[name] = ast.parse(file.read_text(encoding="utf-8"), str(file))
    return found


def _core_names(tree: ast.Module) -> set[str]:
    """Names this module imports from the core: modules (``opening``) and functions."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module.split(".")[0] == "core" or ".core" in f".{node.module}":
                names.update(alias.asname or alias.name for alias in node.names)
    return names


def built_here(tree: ast.Module) -> list[int]:
    """Lines that build a ProtocolError (a call of it, or of one of its constructors)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "ProtocolError":
                lines.append(node.lineno)
            elif (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "ProtocolError"
            ):
                lines.append(node.lineno)
    return lines


def core_refusals_raised(tree: ast.Module, also: frozenset[str] = frozenset()) -> set[str]:
    """What this module raises that the core (or one of ``also``) built."""
    core = _core_names(tree) | also
    raised = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        name = ast.unparse(exc)
        if name.split(".")[0] in core:
            raised.add(name)
    return raised


# engine_broke logs the engine's failure, then returns the core's engine_failed().
_WRAPPERS = frozenset({"engine_broke"})
# The core's exceptions that are not refusals (a bad migration record, turned into the
# core's record_unusable where it is caught).
_NOT_REFUSALS = frozenset({"BadRecord"})


def test_the_shell_builds_no_protocol_error() -> None:
    built = {name: lines for name, tree in shell_modules().items() if (lines := built_here(tree))}
    assert not built, f"ProtocolError built outside the core (module: lines): {built}"


def test_the_shell_raises_the_cores_refusals_only_at_the_listed_places() -> None:
    found = {
        (name.removeprefix("trio_duplex."), refusal)
        for name, tree in shell_modules().items()
        for refusal in core_refusals_raised(tree, _WRAPPERS)
        if refusal not in _NOT_REFUSALS
    }
    assert found == set(ALLOWED), (
        f"raised but not listed: {sorted(found - set(ALLOWED))}; "
        f"listed but not raised: {sorted(set(ALLOWED) - found)}"
    )


# -- self-tests: each check can fail ---------------------------------------------------------


def test_the_checks_find_a_refusal_built_and_one_raised() -> None:
    source = (
        "from ..core import opening\n"
        "from ..core.wire import ProtocolError\n"
        "def f():\n"
        "    raise ProtocolError('bad_event', 'no')\n"
        "def g():\n"
        "    raise ProtocolError.home_unreachable('far')\n"
        "def h():\n"
        "    raise opening.resume_only()\n"
        "def i():\n"
        "    raise ValueError('not a refusal')\n"
    )
    tree = ast.parse(source)
    assert built_here(tree) == [4, 6]
    assert core_refusals_raised(tree) == {
        "ProtocolError",
        "ProtocolError.home_unreachable",
        "opening.resume_only",
    }
    assert shell_modules()  # the shell is found at all
