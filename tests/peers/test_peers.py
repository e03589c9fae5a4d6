"""The peers' own code loads draftzoo's EAGLE-3 exports and computes what draftzoo's drafter does.

speculators (`SpeculatorModel.from_pretrained`, `Eagle3DraftModel.forward`) and SpecForge (its
warm start into `LlamaForCausalLMEagle3`, `OnlineEagle3Model`'s training-time-test loop) run in
their own venvs (`tests/peers/venvs.py`) on the shipped `eagle3-testbed-small`, from a working
directory that is neither the repository nor the export. Their draft logits over several
training-time-test steps must equal draftzoo's `ttt_unroll` on the same tokens and target
states (real testbed states and random ones) within `TOLERANCE`, with every argmax the same.

Neither peer loads EAGLE-1 or a draft LM (speculators 0.9.0 and SpecForge 0.2.0 register no
such class), so those exports have no client here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftzoo.architectures.checkpoint_files import input_embedding
from draftzoo.architectures.eagle import load_eagle, shift
from draftzoo.architectures.export import export_drafter
from draftzoo.architectures.target import TargetAdapter
from draftzoo.architectures.zoo_index import ZooIndex, builtin_zoo_dir
from draftzoo.data.prompts import humaneval_prompts
from draftzoo.train.testbed import committed_testbed_dir
from tests.peers.venvs import run_client

#: training-time-test steps compared (step j drafts j + 1 tokens ahead)
STEPS = 3
#: tokens per sequence: speculators' default flex attention builds 128-position block masks
SEQ = 128
#: largest |logit difference| allowed, float32 on both sides (measured: about 1e-5)
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def target() -> TargetAdapter:
    return TargetAdapter.from_pretrained(committed_testbed_dir())


@pytest.fixture(scope="module")
def shipped() -> Path:
    return ZooIndex(builtin_zoo_dir()).folder("eagle3-testbed-small")


@pytest.fixture(scope="module")
def drafter(shipped, target):
    return load_eagle(shipped, target)


def _real_inputs(target: TargetAdapter, layers) -> dict[str, torch.Tensor]:
    text = "\n".join(p.text for p in humaneval_prompts()[:4])
    seq = target.tokenizer(text, return_tensors="pt").input_ids[:, :SEQ]
    assert seq.shape[1] == SEQ
    with torch.no_grad():
        states = target(seq, hidden_indices=layers, compute_logits=False).hidden_states
    return {"seq": seq, "states": torch.cat([states[k] for k in layers], dim=-1)}


def _random_inputs(target: TargetAdapter, layers) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    vocab, hidden = target.lm_head.weight.shape[0], target.hidden_size
    seq = torch.randint(0, vocab, (1, SEQ), generator=generator)
    return {"seq": seq, "states": torch.randn(1, SEQ, len(layers) * hidden, generator=generator)}


@pytest.fixture(scope="module", params=["real", "random"])
def inputs(request, target, drafter, tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """(file the clients read, draftzoo's logits per step [STEPS, 1, SEQ, V])."""
    make = _real_inputs if request.param == "real" else _random_inputs
    data = make(target, drafter.layers)
    seq, states = data["seq"], data["states"].float().contiguous()
    positions = torch.arange(SEQ)[None]
    allowed = torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool).tril()
    with torch.no_grad():
        outputs = drafter.ttt_unroll(seq, drafter.fuse(states), positions, allowed, STEPS)
        ours = torch.stack([drafter.logits(h) for h in outputs])
    path = tmp_path_factory.mktemp("peer-inputs") / f"{request.param}.safetensors"
    # the peers feed, at position t, the token after it: draftzoo's step-0 tokens
    save_file({"ids": shift(seq, 1), "states": states, "positions": positions}, str(path))
    return path, ours


def _assert_same_logits(theirs: torch.Tensor, ours: torch.Tensor) -> None:
    assert theirs.shape == ours.shape
    for step in range(STEPS):
        gap = (theirs[step] - ours[step]).abs().max().item()
        agree = (theirs[step].argmax(-1) == ours[step].argmax(-1)).float().mean().item()
        print(f"step {step}: max |logit gap| {gap:.2e}, argmax agreement {agree:.3f}")
        assert gap <= TOLERANCE and agree == 1.0, f"step {step}: max gap {gap}, argmax {agree}"


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """A working directory with nothing of draftzoo's in it."""
    path = tmp_path / "elsewhere"
    path.mkdir()
    return path


def test_speculators_loads_the_default_export_and_drafts_the_same(
    shipped, target, inputs, elsewhere, tmp_path
):
    export = export_drafter(shipped, tmp_path / "speculators", "speculators")
    moved = tmp_path / "moved"  # the folder loads wherever it is, from wherever it is used
    shutil.move(export, moved)
    file, ours = inputs
    out = tmp_path / "out.safetensors"
    info = run_client(
        "speculators",
        "speculators_eagle3.py",
        str(moved),
        str(file),
        str(out),
        str(STEPS),
        cwd=elsewhere,
    )
    assert info["class"] == "Eagle3DraftModel"
    assert Path(info["verifier"]).resolve() == committed_testbed_dir().resolve()
    got = load_file(out)
    # the defect this guards: without the tensor, speculators' embedding stays all zeros
    assert torch.equal(got["embed_tokens"], input_embedding(committed_testbed_dir()).float())
    _assert_same_logits(got["logits"], ours)
    assert torch.equal(got["tokens"], ours.argmax(-1))


@pytest.mark.parametrize("mode", ["strict", "lenient"])
def test_specforge_warm_starts_from_the_sglang_export_and_drafts_the_same(
    shipped, inputs, elsewhere, tmp_path, mode
):
    # strict: the export carries the embedding (--embed-tokens); lenient: the default export,
    # then SpecForge's own load_embedding from the target, as its recipes do
    embed = mode == "strict"
    export = export_drafter(shipped, tmp_path / "sglang", "sglang", embed_tokens=embed)
    file, ours = inputs
    out = tmp_path / "out.safetensors"
    args = [str(export), str(file), str(out), str(STEPS), mode]
    if not embed:
        args.append(str(committed_testbed_dir().resolve()))
    info = run_client("specforge", "specforge_eagle3.py", *args, cwd=elsewhere)
    assert info["class"] == "LlamaForCausalLMEagle3"
    assert info["missing_keys"] == ([] if embed else ["embed_tokens.weight"])
    _assert_same_logits(load_file(out)["logits"], ours)


def test_specforge_strict_warm_start_refuses_the_export_without_the_embedding(
    shipped, elsewhere, tmp_path
):
    export = export_drafter(shipped, tmp_path / "sglang", "sglang")
    with pytest.raises(AssertionError, match=r"missing draft weights.*embed_tokens"):
        run_client(  # the warm start fails before the inputs are read
            "specforge",
            "specforge_eagle3.py",
            str(export),
            str(tmp_path / "never-read.safetensors"),
            str(tmp_path / "out.safetensors"),
            str(STEPS),
            "strict",
            cwd=elsewhere,
        )
