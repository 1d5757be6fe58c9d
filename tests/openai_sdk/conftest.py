"""The OpenAI SDKs, each where it can run unchanged: the official Python SDK with its
``realtime`` extra in a venv of its own (the extra pins ``websockets<16``; the project
uses 17), LiveKit Agents' OpenAI plugin and Pipecat's OpenAI realtime service in one
each, the official Node SDK from its own ``package.json``.

``.ci/run`` makes them: ``.venv-openai``, ``.venv-livekit`` and ``.venv-pipecat`` at the
repository's root from ``requirements.txt``, ``livekit-requirements.txt`` and
``pipecat-requirements.txt``, and ``node/node_modules`` by ``npm ci``. Run elsewhere, a
missing one is built once, in a cache dir (``~/.cache/trio-duplex``) keyed by the hash of
its pins; in CI (``CI`` set) a missing or stale one fails the tests, never skips them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.helpers import Certs, issue_certs, node_executable

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
REQUIREMENTS = HERE / "requirements.txt"
NODE_DIR = HERE / "node"
CI_VENV = REPO / ".venv-openai"
INSTALL_TIMEOUT = 600.0


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trio-duplex"


def _digest(*files: Path) -> str:
    sha = hashlib.sha256()
    for file in files:
        sha.update(file.read_bytes())
    return sha.hexdigest()[:16]


def _in_ci() -> bool:
    return bool(os.environ.get("CI"))


def _build_once(final: Path, build: Callable[[Path], None]) -> Path:
    """Build into a fresh folder beside ``final``, then rename it: a half-built one
    (an interrupted run) is never taken for a built one."""
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=final.parent))
    try:
        build(scratch)
        try:
            scratch.rename(final)
        except OSError:  # another session built it meanwhile
            if not final.exists():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final


def _run_install(command: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}"


# -- the Python SDKs, each in a venv of its own ----------------------------------------


@attrs.frozen
class VenvSpec:
    requirements: Path
    folder: Path
    """Where .ci/run makes it."""
    package: str
    """The pinned package whose version shows the venv is this one."""
    module: str
    """What imports it, and prints its version."""

    def pinned(self) -> str:
        pattern = rf"^{re.escape(self.package)}(?:\[[^]]*\])?==(\S+)$"
        match = re.search(pattern, self.requirements.read_text(), re.M)
        assert match is not None, f"{self.requirements} pins no {self.package}==VERSION"
        return match.group(1)


OPENAI_VENV = VenvSpec(
    REQUIREMENTS, CI_VENV, "openai", "import openai, websockets; print(openai.__version__)"
)
LIVEKIT_VENV = VenvSpec(
    HERE / "livekit-requirements.txt",
    REPO / ".venv-livekit",
    "livekit-plugins-openai",
    "import livekit.plugins.openai as p; print(p.__version__)",
)

PIPECAT_VENV = VenvSpec(
    HERE / "pipecat-requirements.txt",
    REPO / ".venv-pipecat",
    "pipecat-ai",
    "import pipecat; print(pipecat.__version__)",
)


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _version_in(python: Path, probe: str) -> str | None:
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120)
    return done.stdout.strip() if done.returncode == 0 else None


def sdk_python(spec: VenvSpec) -> Path:
    """The Python of a venv holding ``spec``'s pins: .ci/run's, or else (outside CI)
    one built once in the cache dir."""
    want = spec.pinned()
    venv = spec.folder
    if not venv.exists():
        if _in_ci():
            pytest.fail(
                f"no venv at {venv}: .ci/run makes it with `python -m venv {venv.name} && "
                f"{venv.name}/bin/pip install -r {spec.requirements.relative_to(REPO)}`"
            )

        def build(folder: Path) -> None:
            _run_install([sys.executable, "-m", "venv", str(folder)])
            python = str(_venv_python(folder))
            _run_install([python, "-m", "pip", "install", "-q", "-r", str(spec.requirements)])

        name = f"{spec.folder.name.lstrip('.')}-{_digest(spec.requirements)}"
        venv = _build_once(_cache_root() / name, build)
    python = _venv_python(venv)
    found = _version_in(python, spec.module)
    if found != want:
        pytest.fail(
            f"{venv} has {spec.package} {found or '(none, or it does not import)'}, "
            f"{spec.requirements.name} pins {want}: rebuild it (rm -r {venv}, then .ci/run's steps)"
        )
    return python


@pytest.fixture(scope="session")
def openai_python() -> Path:
    """The Python of a venv holding the pinned ``openai[realtime]``."""
    return sdk_python(OPENAI_VENV)


@pytest.fixture(scope="session")
def livekit_python() -> Path:
    """The Python of a venv holding the pinned ``livekit-plugins-openai``."""
    return sdk_python(LIVEKIT_VENV)


@pytest.fixture(scope="session")
def pipecat_python() -> Path:
    """The Python of a venv holding the pinned ``pipecat-ai[openai]``."""
    return sdk_python(PIPECAT_VENV)


# -- the Node SDK ------------------------------------------------------------------------


def _node_pins() -> dict[str, str]:
    pins = json.loads((NODE_DIR / "package.json").read_text())["dependencies"]
    assert isinstance(pins, dict)
    return {str(name): str(version) for name, version in pins.items()}


def _installed_versions(modules: Path) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in _node_pins():
        manifest = modules / name / "package.json"
        found[name] = json.loads(manifest.read_text())["version"] if manifest.exists() else None
    return found


def _build_node_modules(folder: Path) -> None:
    for name in ("package.json", "package-lock.json"):
        shutil.copy(NODE_DIR / name, folder / name)
    npm = shutil.which("npm")
    assert npm is not None, "npm is not installed (.ci/run installs it with node)"
    _run_install([npm, "ci", "--no-audit", "--no-fund"], cwd=folder)


@attrs.frozen
class NodeSdk:
    node: str
    modules: Path
    """A node_modules holding the pinned ``openai`` and ``ws``: the scripts' NODE_PATH."""


@pytest.fixture(scope="session")
def openai_node() -> NodeSdk:
    node = node_executable()
    modules = NODE_DIR / "node_modules"
    if not modules.exists():
        if _in_ci():
            pytest.fail(f"no {modules}: .ci/run makes it with `npm ci --prefix {NODE_DIR}`")
        built = _cache_root() / f"openai-node-{_digest(NODE_DIR / 'package-lock.json')}"
        modules = _build_once(built, _build_node_modules) / "node_modules"
    found = _installed_versions(modules)
    if found != _node_pins():
        # (an in-tree node_modules would shadow NODE_PATH, so a stale one is never bypassed)
        pytest.fail(f"{modules} has {found}, package.json pins {_node_pins()}: run npm ci")
    return NodeSdk(node, modules)


# -- the servers -------------------------------------------------------------------------

API_KEY = "sk-sdk-test-0123456789abcdef"


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return issue_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys"
    path.write_text(f"sdk-tests: {API_KEY}\n")
    return path


RUN_TIMEOUT = 240.0
"""One SDK script's whole run, every scenario."""


def run_script(python: Path, script: str, *arguments: str) -> dict[str, Any]:
    """Run ``tests/openai_sdk/<script>.py`` in an SDK's venv (as a module from the
    repository's root, so that it imports ``sdk_shared``); its one JSON object."""
    command = [str(python), "-m", f"tests.openai_sdk.{script}", *arguments]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, f"{script}.py failed:\n{done.stdout}\n{done.stderr}"
    results = json.loads(done.stdout)
    assert isinstance(results, dict)
    return results
