"""Where an EAGLE drafter's inputs go wrong on a device: the two halves of drafting, checked apart.

    python bench/eagle_states_check.py --eagle recipes/zoo/eagle3-testbed-small \
        --device cuda --static --prompts 4

Speculative decoding stays exact whatever the drafts, so a device that feeds the drafter wrong
target states, or runs the drafter wrong, shows up only as a low tau. This script separates the
two causes, per prompt:

1. **states**: decodes greedily with an EAGLE chain (`--static`: preallocated caches, on CUDA
   replayed as graphs) and records every target state the runtime hands the proposer; then
   runs the target once, eagerly and without a cache, over the decoded sequence and compares
   position by position (relative max-abs error per position; the worst and the first
   position above `--tolerance` are printed);
2. **drafter**: feeds those reference states to the drafter on the device and to a copy on the
   CPU (one forward over the sequence, no drafted tokens) and compares the first draft token
   each proposes at every position, and how often it is the target's next token.

On a healthy device both errors are rounding-sized and the two agreement rates match.
"""

from __future__ import annotations

import argparse
import copy

import torch
from bench_target import load_target

from draftzoo.architectures.eagle import DraftCache
from draftzoo.architectures.target import TargetAdapter
from draftzoo.data.prompts import load_prompt_set
from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.generate import SpeculativeGenerator, fused_states
from draftzoo.inference.proposers.eagle import EagleProposer
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.testbed import committed_testbed_dir


class RecordingProposer(EagleProposer):
    """An EAGLE chain proposer that keeps a CPU copy of every state it is handed."""

    def reset(self) -> None:
        super().reset()
        self.seen: list[torch.Tensor] = []

    def observe(self, states: torch.Tensor) -> None:
        self.seen.append(states.detach().float().cpu())
        super().observe(states)


@torch.no_grad()
def reference_states(target, layers, ids: list[int], device) -> torch.Tensor:
    """[len(ids), k*h]: the target's states at `layers`, one eager forward, no cache."""
    with TargetAdapter(target).capture(layers) as captured:
        target(input_ids=torch.tensor([ids], device=device))
    return fused_states(captured, layers)[0].float()


@torch.no_grad()
def first_drafts(drafter, ids: list[int], states: torch.Tensor) -> torch.Tensor:
    """The drafter's first draft token (target ids) at each of the first n = min(len(ids) - 1,
    len(states)) positions, from the states of those positions: [n]."""
    device = drafter.fc.weight.device
    n = min(len(ids) - 1, len(states))
    tokens = torch.tensor([ids[1 : n + 1]], device=device)
    g = drafter.fuse(states[:n][None].to(device, drafter.fc.weight.dtype))
    positions = torch.arange(n, device=device)[None]
    mask = torch.ones(n, n, dtype=torch.bool, device=device).tril()[None, None]
    hidden = drafter.extend(tokens, g, positions, DraftCache(), mask)
    return drafter.to_target_ids(drafter.logits(hidden)[0].argmax(-1)).cpu()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(committed_testbed_dir()))
    parser.add_argument("--eagle", required=True, help="an EAGLE-1 or EAGLE-3 drafter folder")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--static", action="store_true", help="preallocated caches (graphs)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--tolerance", type=float, default=1e-3, help="relative, per position")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    args = parser.parse_args()
    tokenizer, target = load_target(args.target, args.device, args.threads)
    proposer = RecordingProposer.from_pretrained(args.eagle, target, tokenizer)
    on_cpu = copy.deepcopy(proposer.drafter).to("cpu")
    cpu_target = TargetAdapter(copy.deepcopy(target).to("cpu"))
    on_cpu.attach_target(cpu_target.embed_tokens, cpu_target.lm_head)
    generator = SpeculativeGenerator(
        target, tokenizer, proposer, args.gamma, cache=CacheSettings(static=args.static)
    )
    layers = proposer.target_layers
    prompts = [p.render(tokenizer, chat=True) for p in load_prompt_set("humaneval")]
    print(
        f"{args.eagle}: {proposer.drafter.kind}, layers {list(layers)}; {args.device}"
        f"{', static caches' if args.static else ''}; {args.max_new_tokens} tokens, "
        f"gamma {args.gamma}"
    )
    print(
        "prompt   tau  positions  worst state error (at)  first above tolerance  "
        "next-token rate device / cpu  same drafts"
    )
    for index, prompt in enumerate(prompts[: args.prompts]):
        out = generator.generate(prompt, SamplingParams(max_new_tokens=args.max_new_tokens))
        ids = tokenizer(prompt, add_special_tokens=False).input_ids + out.token_ids
        seen = torch.cat(proposer.seen)[: len(ids) - 1]
        reference = reference_states(target, layers, ids, args.device).cpu()[: len(seen)]
        scale = reference.abs().amax(-1).clamp_min(1e-6)
        error = ((seen - reference).abs().amax(-1) / scale).tolist()
        worst = max(range(len(error)), key=error.__getitem__)
        above = next((p for p, e in enumerate(error) if e > args.tolerance), None)
        drafted = first_drafts(proposer.drafter, ids, reference)
        drafted_cpu = first_drafts(on_cpu, ids, reference)
        following = torch.tensor([*ids[2:], -1])[: len(drafted)]  # position t drafts x_{t+2}
        prompt_length = len(ids) - len(out.token_ids)
        scored = slice(prompt_length - 2, len(ids) - 2)  # where generated tokens are drafted
        rate = (drafted[scored] == following[scored]).float().mean().item()
        rate_cpu = (drafted_cpu[scored] == following[scored]).float().mean().item()
        same = (drafted == drafted_cpu).float().mean().item()
        at = f"{error[worst]:.1e} ({worst})"
        first = "-" if above is None else str(above)
        tau = out.metrics.mean_acceptance_length
        print(
            f"{index:>6}  {tau:4.2f}  {len(error):>9}  {at:>22}  {first:>21}  "
            f"{rate:>17.3f} / {rate_cpu:.3f}  {same:>11.3f}"
        )


if __name__ == "__main__":
    main()
