"""What suffix decoding's structures cost: nodes and bytes per token held, and a round's lookup
time against a target forward, measured in one process.

    python bench/suffix_cost.py --tokens 20000 50000 --depth 32 --rounds 200

Tokens are the testbed's own answers to its training requests (`testbed-chat`, tokenized with
its tokenizer), fed to a global `SuffixCache` as requests' outputs of ~300 tokens. Bytes are
the process's resident-set growth while the cache fills (Python objects: a node is a dict and
a count). A round's lookup is `SuffixProposer.speculation` (match in the request and the global
structure, then best-first growth) on contexts cut from held-out answers; the forward is
testbed-small's own 5-token verification forward with a growing cache of the same length.
"""

from __future__ import annotations

import argparse
import gc
import resource
import time

import torch

from draftzoo.inference.suffix import SuffixCache, SuffixProposer, SuffixSettings


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize()


def answers(tokenizer, limit: int, skip: int = 0) -> list[list[int]]:
    """Answers of `testbed-chat` rows from row `skip` on, until `limit` tokens."""
    from draftzoo.data.testbed_chat import iter_testbed_chat_rows

    out, total = [], 0
    for i, row in enumerate(iter_testbed_chat_rows()):
        if i < skip:
            continue
        ids = tokenizer(row["messages"][-1]["content"], add_special_tokens=False).input_ids
        out.append(ids)
        total += len(ids)
        if total >= limit:
            break
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[20000, 50000])
    parser.add_argument("--depth", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    from draftzoo.inference.load import load_target

    target, tokenizer = load_target("testbed-small")
    settings = SuffixSettings(depth=args.depth, tree=True)
    held_out = answers(tokenizer, 20000, skip=12000)  # rows past every size measured
    for size in args.tokens:
        outputs = answers(tokenizer, size)
        gc.collect()
        before = rss_bytes()
        cache = SuffixCache(args.depth, max_tokens=10**9)
        for output in outputs:
            cache.add(output)
        grown = rss_bytes() - before
        proposer = SuffixProposer(settings, cache)
        contexts = [ids[: len(ids) // 2] for ids in held_out if len(ids) > 8][: args.rounds]
        began = time.perf_counter()
        for context in contexts:
            proposer.reset()
            proposer.update(context)
            proposer.speculation(context, 8)
        lookup = (time.perf_counter() - began) / len(contexts)
        per_token = grown / cache.tokens
        length = sum(map(len, contexts)) // len(contexts)
        print(
            f"tokens {cache.tokens}: nodes {cache.trie.nodes} "
            f"({cache.trie.nodes / cache.tokens:.1f} a token), RSS growth {grown / 2**20:.0f} MiB "
            f"({per_token:.0f} B a token, {per_token * 1e6 / 2**30:.1f} GiB per million tokens); "
            f"lookup + update {lookup * 1e3:.2f} ms a round (request of {length} tokens)",
            flush=True,
        )
        del cache, proposer
    ids = torch.tensor([held_out[0][:200]])
    with torch.no_grad():
        out = target(ids[:, :-5], use_cache=True)
        began = time.perf_counter()
        for _ in range(20):
            target(ids[:, -5:], past_key_values=out.past_key_values, use_cache=True)
            out.past_key_values.crop(-5)
        forward = (time.perf_counter() - began) / 20
    print(f"target verification forward (5 tokens after 195): {forward * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
