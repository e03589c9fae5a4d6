"""Chain tau of DFlash drafters (and others beside them) on the same prompts, T = 0 and 1.

    python bench/dflash_tau.py recipes/zoo/dflash-testbed-small runs/dflash-remedies/baseline
        [--prompts 8] [--gamma 4] [--prompt-set humaneval --prompt-set QUESTIONS.jsonl]

Tau (tokens per target forward) does not depend on the clock, so it is measured on a busy
machine as well as on a quiet one; greedy outputs are checked against target-only decoding.
"""

import argparse
import json
from dataclasses import replace
from pathlib import Path

import draftzoo
from draftzoo.data.prompts import load_prompt_set
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.proposal_settings import ProposalSettings
from draftzoo.inference.sampling import SamplingParams


def _tau(generator, prompts, params) -> tuple[float, list[list[int]]]:
    """Tokens per target forward over `prompts` (prompt i sampled with seed i), and outputs."""
    tokens = forwards = 0
    outputs = []
    for i, prompt in enumerate(prompts):
        out = generator.generate(prompt, replace(params, seed=i))
        tokens += out.metrics.num_generated_tokens
        forwards += out.metrics.num_target_forwards
        outputs.append(out.token_ids)
    return tokens / forwards, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafters", nargs="+")
    parser.add_argument("--prompts", type=int, default=8, help="per prompt set")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=4, help="chain length (at most block - 1)")
    parser.add_argument(
        "--prompt-set",
        action="append",
        default=[],
        help="a named set or a question file (repeatable; default humaneval and stdlib-heldout)",
    )
    args = parser.parse_args()
    prompt_sets = args.prompt_set or ["humaneval", "stdlib-heldout"]
    target = tokenizer = prompts = reference = None
    greedy = SamplingParams(max_new_tokens=args.max_new_tokens)
    sampled = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    print(
        f"{'drafter':<40} {'block':>5} {'chain':>5} {'tau T=0':>8} {'tau T=1':>8} "
        f"{'greedy same':>11}"
    )
    for folder in args.drafters:
        # a DFlash drafter's chain is at most its block less the anchor; other families' any
        block = json.loads((Path(folder) / "config.json").read_text()).get("block_size")
        gamma = args.gamma if block is None else min(args.gamma, block - 1)
        # the first drafter's target serves them all (a drafter for another one is refused)
        generator = draftzoo.load(
            folder, target, tokenizer, proposal=ProposalSettings(num_speculative_tokens=gamma)
        )
        if reference is None:
            target, tokenizer = generator.target, generator.tokenizer
            prompts = [
                p.render(tokenizer, chat=True)
                for name in prompt_sets
                for p in load_prompt_set(name)[: args.prompts]
            ]
            plain = SpeculativeGenerator(target, tokenizer)
            reference = [plain.generate(p, greedy).token_ids for p in prompts]
        tau0, outputs = _tau(generator, prompts, greedy)
        tau1, _ = _tau(generator, prompts, sampled)
        same = sum(a == b for a, b in zip(outputs, reference, strict=True))
        shown = "-" if block is None else block
        print(
            f"{folder:<40} {shown:>5} {gamma:>5} {tau0:8.3f} {tau1:8.3f} {same:>5}/{len(prompts)}"
        )


if __name__ == "__main__":
    main()
