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
from draftzoo.architectures.drafter_io import read_drafter_record
from draftzoo.architectures.eagle import load_eagle, shift
from draftzoo.architectures.export import export_drafter
from draftzoo.architectures.target import TargetAdapter
from draftzoo.architectures.zoo_index import ZooIndex, builtin_zoo_dir
from draftzoo.data.prompts import humaneval_prompts
from draftzoo.train.testbed import committed_testbed_dir
from tests.peers.table import record
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
    path = tmp_path_factory.mktemp("peer-inputs") / f"{request.param}.safetensors"
    # the peers feed, at position t, the token after it: draftzoo's step-0 tokens (`seq` is
    # draftzoo's own input, which the clients do not read)
    tensors = {"ids": shift(seq, 1), "states": states, "positions": positions, "seq": seq}
    save_file(tensors, str(path))
    return path, draftzoo_logits(drafter, path)


def draftzoo_logits(drafter, inputs: Path) -> torch.Tensor:
    """draftzoo's draft logits per training-time-test step [STEPS, 1, SEQ, V] on the inputs."""
    x = load_file(inputs)
    allowed = torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool).tril()
    with torch.no_grad():
        fused = drafter.fuse(x["states"])
        outputs = drafter.ttt_unroll(x["seq"], fused, x["positions"], allowed, STEPS)
        return torch.stack([drafter.logits(h) for h in outputs])


def _assert_same_logits(theirs: torch.Tensor, ours: torch.Tensor, row: tuple) -> None:
    """Every step's logits within TOLERANCE and every argmax the same; `row` (family, layout,
    way, peer, inputs) goes into docs/peers.md with the worst step's figures."""
    assert theirs.shape == ours.shape
    gaps, agreements = [], []
    for step in range(len(theirs)):
        gap = (theirs[step] - ours[step]).abs().max().item()
        agree = (theirs[step].argmax(-1) == ours[step].argmax(-1)).float().mean().item()
        print(f"step {step}: max |logit gap| {gap:.2e}, argmax agreement {agree:.3f}")
        gaps.append(gap)
        agreements.append(agree)
    record(*row, max(gaps), min(agreements))
    assert max(gaps) <= TOLERANCE and min(agreements) == 1.0, (gaps, agreements)


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
    row = ("EAGLE-3", "`speculators`", "export -> peer", info["peer"], file.stem)
    _assert_same_logits(got["logits"], ours, row)
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
    layout = "`sglang --embed-tokens` (strict warm start)" if embed else "`sglang` (lenient)"
    row = ("EAGLE-3", layout, "export -> peer", info["peer"], file.stem)
    _assert_same_logits(load_file(out)["logits"], ours, row)


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


@pytest.mark.parametrize("peer", ["speculators", "specforge"])
def test_a_drafter_the_peer_saved_imports_and_drafts_what_the_peer_computes(
    peer, shipped, target, inputs, elsewhere, tmp_path
):
    """The peer loads an export, moves its weights (seeded) and saves them with its own code
    (speculators' `save_pretrained`; SpecForge's SGLang exporter steps: embedding dropped,
    legacy rope fields); `draftzoo import` converts that folder, and the imported drafter's
    logits equal the peer's own forward on the saved folder."""
    from draftzoo.inference.peer_import import import_drafter

    fmt = "speculators" if peer == "speculators" else "sglang"
    export = export_drafter(shipped, tmp_path / "export", fmt)
    saved, out = tmp_path / "saved", tmp_path / "out.safetensors"
    file, shipped_logits = inputs
    testbed = str(committed_testbed_dir().resolve())
    if peer == "speculators":
        run_client(peer, "speculators_save.py", str(export), str(saved), "1", cwd=elsewhere)
        args = ["speculators_eagle3.py", str(saved), str(file), str(out), str(STEPS)]
    else:
        run_client(peer, "specforge_save.py", str(export), testbed, str(saved), "1", cwd=elsewhere)
        args = ["specforge_eagle3.py", str(saved), str(file), str(out), str(STEPS), "lenient"]
        args.append(testbed)
    info = run_client(peer, *args, cwd=elsewhere)
    imported = import_drafter(saved, tmp_path / "imported", testbed)
    ours = draftzoo_logits(load_eagle(imported, target), file)
    theirs = load_file(out)["logits"]
    layout = read_drafter_record(imported)["imported"]["layout"]
    _assert_same_logits(
        theirs, ours, ("EAGLE-3", layout, "peer -> import", info["peer"], file.stem)
    )
    assert (theirs - shipped_logits).abs().max() > 1e-2  # the peer's weights, not the shipped


@pytest.mark.parametrize("layers", [1, 2])
def test_medusa_reference_heads_import_with_allow_pickle_and_give_its_logits(
    target, elsewhere, tmp_path, monkeypatch, layers
):
    """The Medusa reference code's own heads, saved as its training script saves them (a
    pickled `medusa_lm_head.pt`): refused without --allow-pickle, nothing written; with it,
    the imported heads give the reference's logits. Two layers: the reference repeats one
    block object, stored under both names."""
    from draftzoo.architectures.medusa import load_medusa
    from draftzoo.architectures.peer_import import PeerImportError
    from draftzoo.inference.peer_import import import_drafter

    testbed = str(committed_testbed_dir().resolve())
    seq = _real_inputs(target, [target.num_layers])
    file, out, saved = tmp_path / "in.safetensors", tmp_path / "out.safetensors", tmp_path / "m"
    save_file({"states": seq["states"].float().contiguous()}, str(file))
    saved.mkdir()
    args = [testbed, "3", str(layers), str(saved), str(file), str(out), "1"]
    info = run_client("medusa", "medusa_save.py", *args, cwd=elsewhere)
    assert info["files"] == ["config.json", "medusa_lm_head.pt"]
    monkeypatch.delenv("DRAFTZOO_ALLOW_PICKLE", raising=False)
    with pytest.raises(PeerImportError, match=r"only as pickles .*--allow-pickle"):
        import_drafter(saved, tmp_path / "refused", testbed)
    assert not (tmp_path / "refused").exists()
    monkeypatch.setenv("DRAFTZOO_ALLOW_PICKLE", "1")
    imported = import_drafter(saved, tmp_path / "imported", testbed)
    heads = load_medusa(imported, target)
    with torch.no_grad():
        ours = heads(seq["states"].float())
    theirs = load_file(out)["logits"]  # [heads, 1, s, V]: one "step" per head
    layout = f"Medusa reference `medusa_lm_head.pt`, {layers} layer(s)"
    _assert_same_logits(theirs, ours, ("Medusa-1", layout, "peer -> import", info["peer"], "real"))


def test_medusa_reference_loads_the_medusa_export_strictly_and_gives_its_logits(
    target, elsewhere, tmp_path
):
    """The shipped Medusa-1 heads exported in the reference layout: the reference's own heads
    (built from the export's config) load its tensors strictly and compute draftzoo's logits."""
    from draftzoo.architectures.medusa import load_medusa

    shipped = ZooIndex(builtin_zoo_dir()).folder("medusa1-testbed-small")
    export = export_drafter(shipped, tmp_path / "medusa", "medusa")
    seq = _real_inputs(target, [target.num_layers])
    file, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file({"states": seq["states"].float().contiguous()}, str(file))
    testbed = str(committed_testbed_dir().resolve())
    info = run_client(
        "medusa", "medusa_load.py", str(export), testbed, str(file), str(out), cwd=elsewhere
    )
    heads = load_medusa(shipped, target)
    with torch.no_grad():
        ours = heads(seq["states"].float())
    row = (
        "Medusa-1",
        "`medusa` (`medusa_lm_head.safetensors`)",
        "export -> peer",
        info["peer"],
        "real",
    )
    _assert_same_logits(load_file(out)["logits"], ours, row)


def _dflash_drafter(target: TargetAdapter, folder: Path) -> Path:
    """A seeded DFlash drafter for testbed-small (blocks of 4, two layers, taps 2, 6, 9), its
    norms moved off 1 so every tensor matters, saved as training saves one."""
    from draftzoo.architectures.dflash import DflashConfig, build_dflash
    from draftzoo.architectures.drafter_io import save_drafter

    torch.manual_seed(0)
    config = DflashConfig(block_size=4, num_layers=2, layers=(2, 6, 9), mask_token_id=0)
    drafter = build_dflash(config, target)
    with torch.no_grad():
        for parameter in drafter.parameters():
            if parameter.dim() == 1:
                parameter.add_(0.1 * torch.randn_like(parameter))
    recipe = {"target": {"path": str(committed_testbed_dir().resolve())}}
    fingerprint = target.fingerprint()
    return save_drafter(drafter, folder, "dflash", fingerprint, recipe, "none", [2, 6, 9])


#: DFlash blocks the clients and draftzoo compute: anchors (increasing) and the block size
ANCHORS, BLOCK = [5, 20, 41, 77, 100], 4


def _dflash_inputs(target: TargetAdapter) -> dict[str, torch.Tensor]:
    """The clients' inputs: real testbed states at the taps, the tokens, the anchors."""
    seq = _real_inputs(target, [2, 6, 9, target.num_layers])
    hidden = target.hidden_size
    states, final = seq["states"][..., : 3 * hidden], seq["states"][..., 3 * hidden :]
    return {
        "states": states.float().contiguous(),
        "ids": seq["seq"],
        "anchors": torch.tensor(ANCHORS),
        "final": final.float().contiguous(),
    }


def _dflash_logits(drafter, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """draftzoo's logits [1, 1, n*B, V] at every slot of the anchors' blocks, with the blocks'
    inputs and mask built by its training code (train/dflash_loss.py) over the same row."""
    from draftzoo.data.batching import collate
    from draftzoo.train.dflash_loss import block_attention, block_inputs

    ids = tensors["ids"][0].tolist()
    row = {"input_ids": ids, "loss_mask": [1] * len(ids), "lengths": [len(ids)], "index": 0}
    batch = collate([row], 0)
    anchors = tensors["anchors"][None]
    block_ids, positions = block_inputs(drafter, batch, anchors)
    mask = block_attention(batch, anchors, torch.ones_like(anchors, dtype=torch.bool), BLOCK)
    with torch.no_grad():
        hidden = drafter(tensors["states"], batch.position_ids, block_ids, positions, mask)
        return drafter.logits(hidden)[None]


def test_speculators_loads_the_dflash_export_and_drafts_the_same(target, elsewhere, tmp_path):
    """speculators' `DFlashDraftModel` loads the `speculators` DFlash export (its embedding and
    head from the verifier the export names) and its anchored-block forward gives draftzoo's
    block logits at every slot of every block."""
    from draftzoo.architectures.dflash import load_dflash

    folder = _dflash_drafter(target, tmp_path / "dflash")
    export = export_drafter(folder, tmp_path / "speculators", "speculators")
    tensors = _dflash_inputs(target)
    file, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file(tensors, str(file))
    info = run_client(
        "speculators", "speculators_dflash.py", str(export), str(file), str(out), cwd=elsewhere
    )
    assert info["class"] == "DFlashDraftModel" and info["block_starts"] == ANCHORS
    assert info["layer_ids"] == [2, 6, 9]
    ours = _dflash_logits(load_dflash(folder, target), tensors)
    got = load_file(out)
    assert torch.equal(got["embed_tokens"], input_embedding(committed_testbed_dir()).float())
    row = ("DFlash", "`speculators`", "export -> peer", info["peer"], "real")
    _assert_same_logits(got["logits"], ours, row)


def test_a_dflash_drafter_speculators_saved_imports_and_drafts_what_it_computes(
    target, elsewhere, tmp_path
):
    """speculators loads a DFlash export, moves its weights (seeded) and saves them with its
    own `save_pretrained` (no embedding, head or verifier norm); the imported drafter's block
    logits equal speculators' own forward on the saved folder."""
    from draftzoo.architectures.dflash import load_dflash
    from draftzoo.inference.peer_import import import_drafter

    folder = _dflash_drafter(target, tmp_path / "dflash")
    export = export_drafter(folder, tmp_path / "speculators", "speculators")
    saved = tmp_path / "saved"
    run_client("speculators", "speculators_save.py", str(export), str(saved), "1", cwd=elsewhere)
    tensors = _dflash_inputs(target)
    file, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file(tensors, str(file))
    args = [str(saved), str(file), str(out)]
    info = run_client("speculators", "speculators_dflash.py", *args, cwd=elsewhere)
    imported = import_drafter(saved, tmp_path / "imported", str(committed_testbed_dir().resolve()))
    ours = _dflash_logits(load_dflash(imported, target), tensors)
    layout = read_drafter_record(imported)["imported"]["layout"]
    row = ("DFlash", layout, "peer -> import", info["peer"], "real")
    _assert_same_logits(load_file(out)["logits"], ours, row)
    before = _dflash_logits(load_dflash(folder, target), tensors)
    assert (before - ours).abs().max() > 1e-2  # the peer's weights, not the exported ones


#: MTP draft steps compared (the module runs on its own output from the second on)
MTP_STEPS = 3


def _qwen3_target(folder: Path) -> TargetAdapter:
    """A tiny Qwen3 causal LM (speculators' MTP builds Qwen3-family layers only) with the
    testbed's tokenizer, saved where speculators reads its verifier."""
    from tests.conftest import tiny_causal_lm

    model = tiny_causal_lm("qwen3", vocab_size=8192)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(committed_testbed_dir() / name, folder / name)
    return TargetAdapter.from_pretrained(folder)


def _mtp_logits(drafter, ids: torch.Tensor, final: torch.Tensor, steps: int) -> torch.Tensor:
    """draftzoo's teacher-forced logits per step [steps, 1, s - steps - 1, V]: module 0 on the
    target's final states, then on its own hand-over (drafting past its depth)."""
    s = ids.shape[1]
    positions = torch.arange(s)[None]
    allowed = torch.ones(s, s, dtype=torch.bool).tril()[None, None]
    previous, logits = final, []
    with torch.no_grad():
        for k in range(steps):
            previous = drafter.module(0, shift(ids, k + 1), previous, positions + k, allowed)
            logits.append(drafter.logits(previous, 0)[:, : s - steps - 1].float())
    return torch.stack(logits)


def test_an_mtp_drafter_speculators_saved_imports_and_drafts_what_it_computes(elsewhere, tmp_path):
    """speculators builds and saves an MTP drafter for a Qwen3 verifier with its own code;
    imported, draftzoo's MTP module drafts its logits at every step."""
    from draftzoo.architectures.mtp import load_mtp
    from draftzoo.inference.peer_import import import_drafter

    verifier = tmp_path / "qwen3"
    target = _qwen3_target(verifier)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 8192, (1, 48), generator=generator)
    with torch.no_grad():
        final = target(ids, hidden_indices=[target.num_layers], compute_logits=False)
    final = final.hidden_states[target.num_layers].float().contiguous()
    file, out, saved = tmp_path / "in.safetensors", tmp_path / "out.safetensors", tmp_path / "mtp"
    save_file({"ids": ids, "states": final}, str(file))
    args = [str(verifier), str(saved), str(file), str(out), "2", str(MTP_STEPS)]
    info = run_client("speculators", "speculators_mtp.py", *args, cwd=elsewhere)
    imported = import_drafter(saved, tmp_path / "imported", str(verifier))
    record_ = read_drafter_record(imported)
    assert record_["family"] == "mtp" and record_["imported"]["layout"].endswith("MTPDraftModel")
    ours = _mtp_logits(load_mtp(imported, target), ids, final, MTP_STEPS)
    row = ("MTP", "speculators MTPDraftModel", "peer -> import", info["peer"], "random")
    _assert_same_logits(load_file(out)["logits"], ours, row)
