"""The front door: one `draftzoo.load(name)` reads the drafter's record once and each of its
weight files once, and what it hashed is what it loaded."""

from __future__ import annotations

import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest

import draftzoo
from draftzoo.architectures.drafter_files import DrafterFiles
from draftzoo.architectures.drafter_io import RECORD_FILE, checkpoint_hash, defining_files
from draftzoo.architectures.zoo_index import ZooIndex, builtin_zoo_dir

ZOO = ZooIndex(builtin_zoo_dir())
TESTBED_ENTRIES = sorted(n for n, e in ZOO.entries().items() if n.endswith("testbed-small"))
_OPENED: list[Counter] = []


def _count_opens(event: str, args: tuple) -> None:
    if event == "open" and _OPENED and isinstance(args[0], str | Path):
        _OPENED[-1][str(Path(args[0]).resolve())] += 1


sys.addaudithook(_count_opens)  # audit hooks stay for the process: it counts only when asked


@pytest.fixture
def reads(monkeypatch):
    """Opens per file while the test runs, Rust-side safetensors readers included."""
    import safetensors
    import safetensors.torch

    counts: Counter = Counter()

    def counted(real):
        def read(path, *args, **kwargs):
            counts[str(Path(path).resolve())] += 1
            return real(path, *args, **kwargs)

        return read

    monkeypatch.setattr(safetensors.torch, "load_file", counted(safetensors.torch.load_file))
    monkeypatch.setattr(safetensors, "safe_open", counted(safetensors.safe_open))
    _OPENED.append(counts)
    yield counts
    _OPENED.pop()


@pytest.mark.parametrize("name", TESTBED_ENTRIES)
def test_one_load_reads_the_record_once_and_each_weight_file_once(name, reads):
    folder = ZOO.folder(name).resolve()
    weights = [f for f in defining_files(folder) if f.endswith(".safetensors")]
    reads.clear()
    generator = draftzoo.load(name)
    for file in (RECORD_FILE, *weights):
        assert reads[str(folder / file)] == 1, (file, reads[str(folder / file)])
    assert generator.drafter.sha256 == checkpoint_hash(folder)


def test_what_was_hashed_is_what_is_loaded(tmp_path):
    """The bytes read are what load and hash (a file changed afterwards changes neither), and
    they are dropped once the module is built."""
    folder = tmp_path / "eagle3"
    shutil.copytree(ZOO.folder("eagle3-testbed-small"), folder)
    files = DrafterFiles.open(folder)
    before = files.weights()
    digest = files.sha256
    assert digest == checkpoint_hash(folder)
    (folder / "model.safetensors").write_bytes(b"not weights")  # changed after opening
    assert files.sha256 == digest and files.weights().keys() == before.keys()
    assert checkpoint_hash(folder) != digest
    files.release()
    assert files.sha256 == digest and files.record["family"] == "eagle3"
    with pytest.raises(draftzoo.DraftzooError, match="released after its module was built"):
        files.weights()
    with pytest.raises(draftzoo.DraftzooError, match=r"model\.safetensors cannot be read"):
        DrafterFiles.open(folder).weights()
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(draftzoo.DraftzooError, match="safetensors and JSON only"):
        DrafterFiles.open(folder)
