"""Greedy identity over a whole prompt set: speculative outputs vs target-only, batch 1 and 4.

    python bench/identity_check.py --draft recipes/drafters/draft-lm-testbed-small

Decodes every HumanEval prompt (chat-rendered) with target-only batch-1 decoding as the
reference, then with prompt lookup and the draft LM through `BatchGenerator` at each batch
size, and prints the number of prompts whose tokens differ (the runtime's contract is 0) and
the tau of each method.
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftzoo.data.prompts import load_prompt_set
from draftzoo.inference.batch import BatchGenerator
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.proposers import DraftModelProposer, PromptLookupProposer
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.testbed import committed_testbed_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(committed_testbed_dir()))
    parser.add_argument("--draft", help="a draft LM folder (adds draft-LM rows)")
    parser.add_argument("--prompt-set", default="humaneval")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=4)
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    prompts = [p.render(tokenizer, chat=True) for p in load_prompt_set(args.prompt_set)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    reference = [
        SpeculativeGenerator(target, tokenizer).generate(p, params).token_ids for p in prompts
    ]
    factories = {"prompt-lookup": lambda: PromptLookupProposer(1, 3)}
    if args.draft:
        draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
        draft_tokenizer = AutoTokenizer.from_pretrained(args.draft)
        factories["draft-LM"] = lambda: DraftModelProposer(draft, draft_tokenizer, tokenizer)
    print(
        f"{len(prompts)} {args.prompt_set} prompts, {args.max_new_tokens} tokens, greedy, "
        f"gamma {args.gamma}"
    )
    for name, factory in factories.items():
        for size in args.batch_sizes:
            batch = BatchGenerator(
                target, tokenizer, factory, args.gamma, max_speculative_batch=size
            )
            outputs = []
            for start in range(0, len(prompts), size):
                outputs += batch.generate(prompts[start : start + size], params).outputs
            mismatches = sum(o.token_ids != r for o, r in zip(outputs, reference, strict=True))
            tokens = sum(o.metrics.num_generated_tokens for o in outputs)
            forwards = sum(o.metrics.num_target_forwards for o in outputs)
            print(f"{name:14} batch {size}: tau {tokens / forwards:.2f}, mismatches {mismatches}")


if __name__ == "__main__":
    main()
