"""Virtual environments in which the peers' own code runs as a client of draftzoo's exports.

Each peer pins a transformers release other than ours, so each gets its own venv over the
running environment's packages: torch, safetensors, pydantic are shared; the venv's
transformers shadows ours. The running environment may be a plain interpreter, a venv, a conda
env or a uv env: the peer venv's own `site-packages` holds a `.pth` file that adds the running
environment's site directories after its own (`--system-site-packages` would add the *base*
interpreter's instead, which inside a venv has no torch). The peer itself is installed
without its dependencies (they name CUDA-only stacks: sglang, flash-attn, torchaudio) plus the
few modules its code imports. Its transformers comes with the `kernels` extra: transformers
imports `kernels` whenever one is importable, and the running environment's (the release *our*
transformers requires) breaks an older transformers at import, so each venv holds the release
its own transformers names.

    python -m tests.peers.venvs          # build both (what the `peers` tests do on first use)

Venvs live in `$DRAFTZOO_PEERS_DIR` (default `<repo>/.peers`) and are rebuilt when their pins
change. A venv that cannot be built fails the tests that need it: never a silent skip.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Peer:
    """A peer project and the packages its venv needs."""

    name: str
    without_deps: tuple[str, ...]  # the peer and packages whose own dependency pins we skip
    with_deps: tuple[str, ...]  # what its code imports that our environment lacks


PEERS = {
    "speculators": Peer(
        "speculators",
        without_deps=("speculators==0.9.0", "hs-connectors==0.9.0"),
        with_deps=(
            "transformers[kernels]==5.19.0",
            "loguru==0.7.3",
            "openai==3.57.0",
            "pydantic-settings>=2",
        ),
    ),
    "specforge": Peer(
        "specforge",
        # triton: imported by SpecForge's loss module at import time (its kernels need a GPU
        # and are never run here)
        without_deps=("specforge==0.2.0", "triton==3.9.0"),
        with_deps=("transformers[kernels]==5.8.1",),
    ),
    # the Medusa reference code (FasterDecoding/Medusa as published on the index): its heads
    # and their saving; its Llama copy imports transformers 4 internals
    "medusa": Peer(
        "medusa",
        without_deps=("medusa-llm==0.1",),
        with_deps=("transformers==4.46.3",),
    ),
}


def peers_dir() -> Path:
    """Where the venvs live."""
    return Path(os.environ.get("DRAFTZOO_PEERS_DIR") or REPO / ".peers")


#: the file in a peer venv's site-packages that adds the running environment's packages
SHARED_PTH = "draftzoo-shared-site.pth"


def shared_site_dirs() -> list[str]:
    """The running environment's site directories, in its own order (user site included
    when the interpreter uses it)."""
    dirs = [*site.getsitepackages(), sysconfig.get_paths()["purelib"]]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir()]


def _stamp(peer: Peer) -> str:
    return json.dumps(
        {
            "python": sys.version,
            "shared": shared_site_dirs(),
            "without_deps": peer.without_deps,
            "with_deps": peer.with_deps,
        }
    )


def _share_running_site(venv: Path) -> None:
    """Add the running environment's site directories to `venv`, after its own packages.

    `site.addsitedir` also runs their `.pth` files, so editable installs are found too."""
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    lines = [f"import site; site.addsitedir({d!r})" for d in shared_site_dirs()]
    (Path(purelib) / SHARED_PTH).write_text("\n".join(lines) + "\n")


def _pip(python: Path, *args: str) -> None:
    command = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    result = subprocess.run([*command, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(args)} failed:\n{result.stderr[-4000:]}")


def venv_python(name: str) -> Path:
    """The interpreter of peer `name`'s venv, built first if missing or stale."""
    peer = PEERS[name]
    root = peers_dir() / name
    python = root / "bin" / "python"
    stamp = root / "draftzoo-peer.json"
    if stamp.is_file() and stamp.read_text() == _stamp(peer) and python.exists():
        return python
    building = root.with_name(name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(building)], check=True)
    _share_running_site(building)
    _pip(building / "bin" / "python", "--no-deps", *peer.without_deps)
    _pip(building / "bin" / "python", *peer.with_deps)
    (building / "draftzoo-peer.json").write_text(_stamp(peer))
    shutil.rmtree(root, ignore_errors=True)
    building.rename(root)
    return python


def run_client(name: str, script: str, *args: str, cwd: Path) -> dict:
    """Run `clients/<script>` in peer `name`'s venv from `cwd`; its last stdout line (JSON)."""
    client = Path(__file__).with_name("clients") / script
    env = {**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run(
        [str(venv_python(name)), str(client), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
    )
    if result.returncode != 0:
        raise AssertionError(f"{name} client {script} failed:\n{result.stderr[-6000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    for peer_name in PEERS:
        print(peer_name, venv_python(peer_name))
