"""Where DFlash trees pay: chains against static trees over the block's slots, on one drafter.

    python bench/dflash_trees.py [--drafter runs/dflash-testbed-small] [--output-dir DIR]

1. Each drafted slot's rank accuracy (how often the target's greedy token is the slot's r-th
   most likely), teacher-forced on the target's own greedy continuations of calibration prompts
   that the evaluation does not use (HumanEval prompts 13-40): every position of each
   continuation is an anchor, all blocks in one drafter forward.
2. Trees: the default 16-node tree, and Medusa's tree search over those accuracies
   (`PositionTree.calibrated`) at several node budgets, with the acceptance length it expects.
3. Each chain and tree evaluated at the zoo cards' settings (HumanEval and stdlib-heldout, 12
   prompts each after a warm-up, 128 new tokens, T = 0 and T = 1, no certificate): tau and
   greedy identity; draft / verify ms and speedup as measured (the report's timing verdict says
   whether the machine was quiet).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from draftzoo.architectures.dflash import load_dflash
from draftzoo.architectures.drafter_io import read_drafter_record
from draftzoo.architectures.target import TargetAdapter
from draftzoo.data.prompts import humaneval_prompts
from draftzoo.eval.runner import EvalConfig, evaluate
from draftzoo.inference.load import load_drafter, load_target, recorded_target
from draftzoo.inference.proposal_settings import ProposalSettings
from draftzoo.inference.proposers.position_tree import PositionTree

CALIBRATION = slice(13, 41)  # HumanEval prompts the evaluation (first 13) does not read
RANKS = 10
NODES = (8, 16, 32, 64)
CARD = EvalConfig(
    prompt_sets=("humaneval", "stdlib-heldout"),
    max_prompts=12,
    max_new_tokens=128,
    temperatures=(0.0, 1.0),
    certificate_samples=0,
)


@torch.no_grad()
def rank_accuracy(drafter, adapter: TargetAdapter, tokens: int = 128) -> list[list[float]]:
    """[slot][rank]: how often the target's greedy token at anchor + slot is the slot's r-th."""
    block, taps = drafter.block_size, list(drafter.taps)
    hits = torch.zeros(block - 1, RANKS)
    total = 0
    for prompt in humaneval_prompts()[CALIBRATION]:
        text = prompt.render(adapter.tokenizer, chat=True)
        ids = adapter.tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
        out = adapter.model.generate(ids, max_new_tokens=tokens, do_sample=False)
        seq, start = out[:, : ids.shape[1] + tokens], ids.shape[1] - 1
        states = adapter(seq, hidden_indices=taps, compute_logits=False).hidden_states
        states = torch.cat([states[k] for k in taps], dim=-1)
        anchors = list(range(start, seq.shape[1] - block + 1))
        ranks = _slot_ranks(drafter, seq, states, anchors)
        for slot in range(block - 1):
            hits[slot] += torch.bincount(ranks[:, slot].clamp(max=RANKS), minlength=RANKS + 1)[
                :RANKS
            ].float()
        total += len(anchors)
    return (hits / total).tolist()


def _slot_ranks(drafter, seq, states, anchors: list[int]) -> torch.Tensor:
    """[anchors, slots]: the rank of the true token among each drafted slot's logits, every
    block's inputs and mask built by the training code (train/dflash_loss.py)."""
    from draftzoo.data.batching import collate
    from draftzoo.train.dflash_loss import block_attention, block_inputs

    ids, block = seq[0].tolist(), drafter.block_size
    batch = collate(
        [{"input_ids": ids, "loss_mask": [1] * len(ids), "lengths": [len(ids)], "index": 0}], 0
    )
    starts = torch.tensor(anchors)[None]
    block_ids, positions = block_inputs(drafter, batch, starts)
    mask = block_attention(batch, starts, torch.ones_like(starts, dtype=torch.bool), block)
    hidden = drafter(states, batch.position_ids, block_ids, positions, mask)
    logits = drafter.logits(hidden).float().view(len(anchors), block, -1)[:, 1:]  # drafted slots
    truth = seq[0, starts[0, :, None] + torch.arange(1, block)]  # [n, slots]
    own = logits.gather(-1, truth[..., None])
    return (logits > own).sum(-1)


def measure(folder: Path, model, tokenizer, name: str, config: EvalConfig) -> dict:
    runtime = load_drafter(folder, model, tokenizer, config.proposal, config.cache)
    return evaluate(model, tokenizer, runtime, config, name, show_progress=False)


def _result(r: dict) -> str:
    """One temperature's figures."""
    identity = r.get("greedy_identity")
    shown = f" identity {identity['identical']}/{identity['decodes']}" if identity else ""
    return (
        f"T={r['temperature']:g} tau {r['tau']:.3f}{shown} draft/verify "
        f"{r['draft_ms_per_round']:.2f}/{r['verify_ms_per_round']:.2f} ms speedup "
        f"{r['speedup']['mean']:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", type=Path, default=Path("runs/dflash-testbed-small"))
    parser.add_argument("--output-dir", type=Path)
    args = parser.parse_args()
    record = read_drafter_record(args.drafter)
    target_name = recorded_target(record)
    model, tokenizer = load_target(target_name)
    adapter = TargetAdapter(model, tokenizer)
    drafter = load_dflash(args.drafter, adapter)
    accuracy = rank_accuracy(drafter, adapter)
    print("slot rank accuracy (slot: top-1 .. top-4):")
    for slot, row in enumerate(accuracy, start=1):
        print(f"  {slot}: " + " ".join(f"{a:.3f}" for a in row[:4]))
    longest = drafter.block_size - 1
    setups: dict[str, EvalConfig] = {
        f"chain of {n}": replace(CARD, proposal=ProposalSettings(num_speculative_tokens=n))
        for n in sorted({3, longest})
    }
    trees = {"default tree (16)": PositionTree.default(longest)}
    trees.update({f"calibrated {n}": PositionTree.calibrated(accuracy, n) for n in NODES})
    for label, tree in trees.items():
        setups[label] = replace(CARD, proposal=replace(CARD.proposal, tree=tree))
    for label, config in setups.items():
        report = measure(args.drafter, model, tokenizer, target_name, config)
        expected = ""
        if config.proposal.drafts_tree:
            estimate = config.proposal.tree.estimated_acceptance(accuracy)
            expected = f" (expected T=0 tau {estimate:.2f})"
        line = "; ".join(_result(r) for r in report["results"])
        timing = "reliable" if report["timing"]["reliable"] else "UNRELIABLE timing"
        print(f"{label:20} {line} [{timing}]{expected}", flush=True)
        if args.output_dir:
            args.output_dir.mkdir(parents=True, exist_ok=True)
            stem = label.replace(" ", "-").replace("(", "").replace(")", "")
            (args.output_dir / f"report-{stem}.json").write_text(json.dumps(report, indent=1))
    if args.output_dir:
        (args.output_dir / "rank-accuracy.json").write_text(json.dumps(accuracy, indent=1))


if __name__ == "__main__":
    main()
