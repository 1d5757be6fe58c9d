"""The core writes no wire text itself: every frame comes from a dialect (``Spelling``).

Checked by reading the core's modules: none imports a JSON library but the two that
serialize something that is not an event (listed below, with why).
"""

from __future__ import annotations

import ast
from pathlib import Path

import trio_duplex.core

CORE = Path(trio_duplex.core.__file__).parent
JSON_LIBRARIES = {"json", "orjson"}
ALLOWED = {
    "wire.py": {"json"},  # ConfigBudget: a configuration's size is counted in compact JSON
    "migration.py": {"orjson"},  # a migration record's own format, never sent to a client
}


def json_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        found |= {name.partition(".")[0] for name in names} & JSON_LIBRARIES
    return found


def test_no_core_module_but_the_listed_ones_imports_a_json_library() -> None:
    found = {p.name: json_imports(p) for p in sorted(CORE.glob("*.py")) if json_imports(p)}
    assert found == ALLOWED


def test_the_check_sees_an_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import json.scanner\nfrom orjson import dumps\n")
    assert json_imports(module) == {"json", "orjson"}
