"""Where batched speculation stops paying: speculative vs plain batched decoding per batch size.

    python bench/batch_bench.py --batch-sizes 1 2 4 8 16 --prompts 16 --max-new-tokens 96
    python bench/batch_bench.py --draft runs/draft-lm-testbed-small   # a draft LM instead
    python bench/batch_bench.py --device cuda --static   # static caches, CUDA graphs on CUDA

Same target (`testbed-small` unless --target), same chat-rendered HumanEval prompts, same
process. For each batch size the prompts are decoded in batches twice, interleaved: plain
(`max_speculative_batch=0`, no proposals) and speculative (prompt lookup, or --draft, gamma
fixed), both on the growing cache or both on the static one (`--static`: the target's rows in
buffers allocated once, each (rows, width) forward a CUDA graph on CUDA; the draft LM's cache
static too). It prints tokens/s of both and their ratio; the crossover is the first batch size whose
ratio falls below 1 — the value `BatchGenerator(max_speculative_batch=...)` should sit below.
Greedy outputs of both are compared token for token.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftzoo.data.prompts import humaneval_prompts
from draftzoo.inference.batch import BatchGenerator
from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.proposers.draft_lm import DraftModelProposer
from draftzoo.inference.proposers.prompt_lookup import PromptLookupProposer
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.testbed import committed_testbed_dir


def _run(generator, prompts, batch_size, params):
    tokens, seconds, outputs = 0, 0.0, []
    for start in range(0, len(prompts), batch_size):
        began = time.perf_counter()
        out = generator.generate(prompts[start : start + batch_size], params)
        seconds += time.perf_counter() - began
        tokens += sum(o.metrics.num_generated_tokens for o in out.outputs)
        outputs += [o.token_ids for o in out.outputs]
    return tokens / seconds, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(committed_testbed_dir()))
    parser.add_argument("--draft", help="a draft LM folder instead of prompt lookup")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--static", action="store_true", help="static caches (graphs on CUDA)")
    parser.add_argument(
        "--dtype", choices=["bfloat16", "float32"], help="default: bfloat16 on CUDA, else float32"
    )
    args = parser.parse_args()

    device = torch.device(args.device)
    default = "bfloat16" if device.type == "cuda" else "float32"
    dtype = getattr(torch, args.dtype or default)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(device).eval()
    cache_length = args.max_new_tokens + 1024  # rendered HumanEval prompts fit in 1024 tokens
    if args.draft:
        draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=dtype).to(device).eval()
        draft_tokenizer = AutoTokenizer.from_pretrained(args.draft)

        def factory():
            return DraftModelProposer(
                draft,
                draft_tokenizer,
                tokenizer,
                cache=CacheSettings(static=args.static, max_length=cache_length),
            )
    else:

        def factory():
            return PromptLookupProposer(1, 3)

    prompts = [p.render(tokenizer, chat=True) for p in humaneval_prompts()[: args.prompts]]
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    static = {"cache": CacheSettings(static=args.static, max_length=cache_length)}
    plain = BatchGenerator(target, tokenizer, factory, args.gamma, 0, **static)
    spec = BatchGenerator(target, tokenizer, factory, args.gamma, 10**6, **static)
    warm = SamplingParams(max_new_tokens=8)
    for size in args.batch_sizes:  # warm-up (with --static on CUDA: most graph captures)
        _run(plain, prompts[:size], size, warm)
        _run(spec, prompts[:size], size, warm)
    print(
        f"{len(prompts)} prompts, {args.max_new_tokens} new tokens, greedy, gamma {args.gamma}, "
        f"{'draft LM ' + args.draft if args.draft else 'prompt lookup'}, {device}, {dtype}, "
        f"{'static cache' if args.static else 'dynamic cache'}, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"{'batch':>5} {'plain tok/s':>12} {'spec tok/s':>11} {'ratio':>7} {'mismatch':>9}")
    crossover = None
    for size in args.batch_sizes:
        plain_rate, plain_out = _run(plain, prompts, size, params)
        spec_rate, spec_out = _run(spec, prompts, size, params)
        mismatches = sum(a != b for a, b in zip(plain_out, spec_out, strict=True))
        ratio = spec_rate / plain_rate
        if ratio < 1 and crossover is None:
            crossover = size
        print(f"{size:>5} {plain_rate:12.1f} {spec_rate:11.1f} {ratio:6.2f}x {mismatches:>9}")
    print(f"crossover (first batch size where speculation loses): {crossover or 'none measured'}")


if __name__ == "__main__":
    main()
