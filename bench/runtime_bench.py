"""Side-by-side decoding benchmark: draftzoo speculative vs target-only vs transformers.

    python bench/runtime_bench.py --prompts 20 --max-new-tokens 128
    python bench/runtime_bench.py --draft runs/draft-lm --prompts 20   # adds draft-LM rows
    python bench/runtime_bench.py --draft runs/a --draft runs/b --draftzoo-only  # compare drafters

Prompts are rendered with the target's chat template as instruction turns (the testbed target
learned HumanEval-style signature + docstring prompts as chat pairs); --raw sends them bare.

Every method decodes the same HumanEval prompts with the same target (`testbed-small` unless
--target), in one process, interleaved prompt by prompt, after one warm-up prompt. It prints
tau (tokens per target forward), tokens/s, and the ratios that matter: speculative over
target-only in draftzoo's runtime, and draftzoo over transformers for the same method
(`generate(prompt_lookup_num_tokens=...)`, `generate(assistant_model=...)`). Greedy outputs are
compared token for token with draftzoo's target-only output.

On a GPU (`--device cuda --static`), rows marked "static" run draftzoo with preallocated KV
caches whose decode forwards replay as CUDA graphs (target and draft LM); the others keep the
growing cache, eager, like transformers' `generate`.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from bench_target import load_target
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftzoo.data.prompts import load_prompt_set
from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.proposers.draft_lm import DraftModelProposer
from draftzoo.inference.proposers.prompt_lookup import PromptLookupProposer
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.testbed import committed_testbed_dir


def _hf_generate(target, tokenizer, prompt, max_new_tokens, **kwargs):
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(target.device)
    began = time.perf_counter()
    out = target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        **kwargs,
    )
    seconds = time.perf_counter() - began
    return out[0, ids.shape[1] :].tolist(), seconds, None


def _dz_generate(generator, prompt, params):
    began = time.perf_counter()
    out = generator.generate(prompt, params)
    return out.token_ids, time.perf_counter() - began, out.metrics


def _draft_methods(folder, suffix, target, tokenizer, greedy, eos, args) -> dict:
    """draftzoo (fixed and adaptive gamma) and transformers assisted generation with one draft."""

    def load():
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        return model.to(args.device).eval()

    draft_tokenizer = AutoTokenizer.from_pretrained(folder)
    proposer = DraftModelProposer(load(), draft_tokenizer, tokenizer)
    fixed = SpeculativeGenerator(target, tokenizer, proposer, args.gamma)
    adaptive = SpeculativeGenerator(target, tokenizer, proposer)
    # transformers' assistant: a second instance, so the two runtimes share no state
    assistant = load()
    assistant.generation_config.num_assistant_tokens = args.gamma
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    methods = {
        f"draftzoo draft-LM{suffix}": lambda p: _dz_generate(fixed, p, greedy),
        f"draftzoo draft-LM adaptive{suffix}": lambda p: _dz_generate(adaptive, p, greedy),
        f"transformers draft-LM{suffix}": lambda p: _hf_generate(
            target,
            tokenizer,
            p,
            args.max_new_tokens,
            eos_token_id=sorted(eos),
            assistant_model=assistant,
        ),
    }
    if args.static:
        static_proposer = DraftModelProposer(
            load(), draft_tokenizer, tokenizer, cache=CacheSettings(static=True)
        )
        static = SpeculativeGenerator(
            target, tokenizer, static_proposer, args.gamma, CacheSettings(static=True)
        )
        methods[f"draftzoo draft-LM static{suffix}"] = lambda p: _dz_generate(static, p, greedy)
    return methods


def _parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(committed_testbed_dir()))
    parser.add_argument(
        "--draft",
        action="append",
        default=[],
        help="draft LM folder (same tokenizer as the target); repeat to compare drafters",
    )
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=4, help="fixed gamma for every method")
    parser.add_argument(
        "--raw", action="store_true", help="bare completion prompts instead of the chat template"
    )
    parser.add_argument(
        "--draftzoo-only",
        action="store_true",
        help="skip the transformers rows (long identity runs)",
    )
    parser.add_argument(
        "--methods",
        help="comma-separated name parts: run only methods whose name contains one of them "
        "(draftzoo target-only always runs as the reference), e.g. 'draft-LM ['",
    )
    parser.add_argument("--prompt-set", default="humaneval", help="humaneval or stdlib-heldout")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--static",
        action="store_true",
        help="add draftzoo rows on preallocated caches (CUDA graphs on cuda)",
    )
    return parser.parse_args()


def _methods(args, target, tokenizer, greedy) -> dict:
    """{name: prompt -> (ids, seconds, metrics)} of every method the flags ask for."""
    plain = SpeculativeGenerator(target, tokenizer)
    # transformers stops at EOS too: give both runtimes the same stop tokens
    eos = plain.eos_ids
    lookup = SpeculativeGenerator(target, tokenizer, PromptLookupProposer(1, 3), args.gamma)
    lookup_adaptive = SpeculativeGenerator(target, tokenizer, PromptLookupProposer(1, 3))
    methods = {
        "draftzoo target-only": lambda p: _dz_generate(plain, p, greedy),
        "draftzoo prompt-lookup": lambda p: _dz_generate(lookup, p, greedy),
        "draftzoo prompt-lookup adaptive": lambda p: _dz_generate(lookup_adaptive, p, greedy),
        "transformers target-only": lambda p: _hf_generate(
            target, tokenizer, p, args.max_new_tokens, eos_token_id=sorted(eos)
        ),
        "transformers prompt-lookup": lambda p: _hf_generate(
            target,
            tokenizer,
            p,
            args.max_new_tokens,
            eos_token_id=sorted(eos),
            prompt_lookup_num_tokens=args.gamma,
            max_matching_ngram_size=3,
        ),
    }
    if args.static:
        plain_static = SpeculativeGenerator(target, tokenizer, cache=CacheSettings(static=True))
        lookup_static = SpeculativeGenerator(
            target,
            tokenizer,
            PromptLookupProposer(1, 3),
            args.gamma,
            cache=CacheSettings(static=True),
        )
        methods["draftzoo target-only static"] = lambda p: _dz_generate(plain_static, p, greedy)
        methods["draftzoo prompt-lookup static"] = lambda p: _dz_generate(lookup_static, p, greedy)
    for index, folder in enumerate(args.draft):
        suffix = "" if len(args.draft) == 1 else f" [{index}]"
        print(f"draft-LM{suffix}: {folder}")
        methods.update(_draft_methods(folder, suffix, target, tokenizer, greedy, eos, args))

    if args.draftzoo_only:
        methods = {k: v for k, v in methods.items() if k.startswith("draftzoo")}
    if args.methods:
        wanted = [part for part in args.methods.split(",") if part]
        methods = {
            k: v
            for k, v in methods.items()
            if k == "draftzoo target-only" or any(part in k for part in wanted)
        }
    return methods


def main() -> None:
    args = _parse_args()
    tokenizer, target = load_target(args.target, args.device, args.threads)
    greedy = SamplingParams(max_new_tokens=args.max_new_tokens)
    methods = _methods(args, target, tokenizer, greedy)
    prompts = [p.render(tokenizer, chat=not args.raw) for p in load_prompt_set(args.prompt_set)]
    prompts = prompts[: args.prompts + 1]
    tokens, seconds, forwards = defaultdict(int), defaultdict(float), defaultdict(int)
    mismatches = defaultdict(int)
    with torch.no_grad():
        for index, prompt in enumerate(prompts):
            reference = None
            for name, run in methods.items():  # interleaved: every method on this prompt
                ids, secs, metrics = run(prompt)
                if name == "draftzoo target-only":
                    reference = ids
                elif ids != reference:
                    mismatches[name] += 1
                if index == 0:
                    continue  # warm-up
                tokens[name] += len(ids)
                seconds[name] += secs
                if metrics is not None:
                    forwards[name] += metrics.num_target_forwards

    base = tokens["draftzoo target-only"] / seconds["draftzoo target-only"]
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(
        f"{args.prompts} {args.prompt_set} prompts, {args.max_new_tokens} new tokens, greedy, "
        f"gamma {args.gamma}, {torch.get_num_threads()} threads, {device}"
    )
    print(f"{'method':34} {'tau':>6} {'tok/s':>8} {'vs dz target-only':>18} {'mismatch':>9}")
    for name in methods:
        rate = tokens[name] / seconds[name]
        tau = f"{tokens[name] / forwards[name]:.2f}" if forwards[name] else "-"
        print(f"{name:34} {tau:>6} {rate:8.1f} {rate / base:17.2f}x {mismatches[name]:>9}")
    _print_ratios(methods, tokens, seconds, base)


def _print_ratios(methods, tokens, seconds, base) -> None:
    """draftzoo over transformers for each pair of methods both ran."""
    pairs = [("draftzoo prompt-lookup", "transformers prompt-lookup")]
    pairs += [
        (name.replace("transformers", "draftzoo"), name)
        for name in methods
        if name.startswith("transformers draft")
    ]
    pairs += [
        ("draftzoo target-only static", "transformers target-only"),
        ("draftzoo prompt-lookup static", "transformers prompt-lookup"),
    ]
    pairs += [
        (name, name.replace("draftzoo", "transformers").replace(" static", ""))
        for name in methods
        if name.startswith("draftzoo draft-LM static")
    ]
    for ours, theirs in pairs:
        method = ours.removeprefix("draftzoo ")
        if ours in tokens and theirs in tokens:
            ratio = (tokens[ours] / seconds[ours]) / (tokens[theirs] / seconds[theirs])
            print(f"draftzoo {method} / {theirs}: {ratio:.2f}x")
    if "transformers target-only" in methods:
        hf_rate = tokens["transformers target-only"] / seconds["transformers target-only"]
        print(f"draftzoo / transformers, target-only: {base / hf_rate:.2f}x")


if __name__ == "__main__":
    main()
