"""Greedy identity over a whole prompt set: speculative outputs vs target-only, batch 1 and 4.

    python bench/identity_check.py --draft recipes/zoo/draft-lm-testbed-small
    python bench/identity_check.py --no-prompt-lookup --eagle runs/eagle3-testbed-small

Decodes every HumanEval prompt (chat-rendered) target-only at each batch size (the reference
for that batch size), then with prompt lookup and the draft LM through `BatchGenerator`, and
prints the number of prompts whose tokens differ from the reference (the runtime's contract
is 0) and the tau of each method. It also prints how many prompts the target-only outputs at
batch N differ from batch 1 in: a batched forward rounds differently, and where two logits are
exactly tied in float32 the argmax can flip. That is the target's own batch variance, not
speculation's; the prompt, position and tied logits of each such case are printed.
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftzoo.data.prompts import load_prompt_set
from draftzoo.inference.batch import BatchGenerator
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.proposers.draft_lm import DraftModelProposer
from draftzoo.inference.proposers.eagle import EagleProposer, TreeSettings
from draftzoo.inference.proposers.prompt_lookup import PromptLookupProposer
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.testbed import committed_testbed_dir


def _parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(committed_testbed_dir()))
    parser.add_argument("--draft", help="a draft LM folder (adds draft-LM rows)")
    parser.add_argument("--eagle", help="an EAGLE drafter folder (adds chain and tree rows)")
    parser.add_argument(
        "--no-prompt-lookup", action="store_true", help="skip the prompt-lookup rows"
    )
    parser.add_argument("--prompt-set", default="humaneval")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=4)
    return parser.parse_args()


def main() -> None:
    args = _parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    prompts = [p.render(tokenizer, chat=True) for p in load_prompt_set(args.prompt_set)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens)

    def decode(factory, size: int):
        batch = BatchGenerator(target, tokenizer, factory, args.gamma, max_speculative_batch=size)
        outputs = []
        for start in range(0, len(prompts), size):
            outputs += batch.generate(prompts[start : start + size], params).outputs
        return outputs

    single = [SpeculativeGenerator(target, tokenizer).generate(p, params) for p in prompts]
    references = {1: [o.token_ids for o in single]}
    for size in args.batch_sizes:
        if size == 1:
            continue
        references[size] = [o.token_ids for o in decode(None, size)]
        for i, (a, b) in enumerate(zip(references[size], references[1], strict=True)):
            if a != b:
                pairs = enumerate(zip(a, b, strict=False))
                at = next((k for k, (x, y) in pairs if x != y), min(len(a), len(b)))
                ids = tokenizer(prompts[i], add_special_tokens=False).input_ids + b[:at]
                with torch.no_grad():
                    top = target(torch.tensor([ids])).logits[0, -1].topk(2)
                print(
                    f"target-only batch {size} vs 1: prompt {i} differs at token {at}; "
                    f"batch-1 top-2 logits {top.values.tolist()} for tokens {top.indices.tolist()}"
                )
    factories = {}
    if not args.no_prompt_lookup:
        factories["prompt-lookup"] = lambda: PromptLookupProposer(1, 3)
    if args.draft:
        draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
        draft_tokenizer = AutoTokenizer.from_pretrained(args.draft)
        factories["draft-LM"] = lambda: DraftModelProposer(draft, draft_tokenizer, tokenizer)
    if args.eagle:
        drafter = EagleProposer.from_pretrained(args.eagle, target, tokenizer).drafter
        factories["EAGLE chain"] = lambda: EagleProposer(drafter)
        factories["EAGLE tree"] = lambda: EagleProposer(drafter, TreeSettings())
    print(
        f"{len(prompts)} {args.prompt_set} prompts, {args.max_new_tokens} tokens, greedy, "
        f"gamma {args.gamma}"
    )
    for size in args.batch_sizes:
        differ = sum(a != b for a, b in zip(references[size], references[1], strict=True))
        print(f"target-only  batch {size}: differs from batch 1 in {differ} prompts")
    for name, factory in factories.items():
        for size in args.batch_sizes:
            outputs = decode(factory, size)
            reference = references[size]
            differ = [
                i
                for i, (o, r) in enumerate(zip(outputs, reference, strict=True))
                if o.token_ids != r
            ]
            tokens = sum(o.metrics.num_generated_tokens for o in outputs)
            forwards = sum(o.metrics.num_target_forwards for o in outputs)
            print(
                f"{name:14} batch {size}: tau {tokens / forwards:.2f}, "
                f"mismatches vs target-only batch {size}: {len(differ)}"
            )
            for i in differ:
                same = outputs[i].token_ids == references[1][i]
                print(
                    f"  prompt {i}: {'equals' if same else 'differs from'} target-only batch 1 too"
                )


if __name__ == "__main__":
    main()
