"""What suffix decoding's structures cost: nodes and bytes per token held, and a round's lookup
time against a target forward, measured in one process.

    python bench/suffix_cost.py --tokens 20000 50000 --depth 32 --rounds 200
    python bench/suffix_cost.py --target smollm2-135m-instruct \
        --answers runs/smollm2-data/train.jsonl --heldout-skip 4500

Tokens are the target's own answers to its training requests (testbed-small: `testbed-chat`;
--answers: the last turn of each row of a conversation file), tokenized with its tokenizer,
fed to a global `SuffixCache` as requests' outputs. Bytes are
the process's resident-set growth while the cache fills (Python objects: a node is a dict and
a count). A round's lookup is `SuffixProposer.speculation` (match in the request and the global
structure, then best-first growth) on contexts cut from held-out answers (rows from
--heldout-skip on); the forward is the target's own 5-token verification forward with a
growing cache of the same length.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import time

import torch
from transformers import DynamicCache

from draftzoo.inference.kv_cache import cache_kwargs, crop
from draftzoo.inference.proposers.suffix import SuffixCache, SuffixProposer, SuffixSettings


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize()


def conversation_rows(path: str | None):
    """`testbed-chat`'s rows, or a conversation file's (one JSON object a line)."""
    if path is None:
        from draftzoo.data.testbed_chat import iter_testbed_chat_rows

        yield from iter_testbed_chat_rows()
        return
    with open(path) as handle:
        yield from (json.loads(line) for line in handle if line.strip())


def answers(tokenizer, limit: int, skip: int = 0, path: str | None = None) -> list[list[int]]:
    """The last turn of each row from row `skip` on, until `limit` tokens."""
    out, total = [], 0
    for i, row in enumerate(conversation_rows(path)):
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
    parser.add_argument("--target", default="testbed-small")
    parser.add_argument("--answers", help="a conversation file (default: testbed-chat)")
    parser.add_argument(
        "--heldout-skip", type=int, default=12000, help="lookups on rows from this one on"
    )
    args = parser.parse_args()
    from draftzoo.inference.load import load_target

    target, tokenizer = load_target(args.target)
    settings = SuffixSettings(depth=args.depth, tree=True)
    held_out = answers(tokenizer, 20000, args.heldout_skip, args.answers)
    for size in args.tokens:
        outputs = answers(tokenizer, size, 0, args.answers)
        if sum(map(len, outputs)) < size or len(outputs) > args.heldout_skip:
            parser.error(f"--tokens {size}: the rows before --heldout-skip do not hold it")
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
    ids = torch.tensor([next(a for a in held_out if len(a) >= 200)[:200]])
    cache = DynamicCache()
    with torch.no_grad():
        target(input_ids=ids[:, :-5], **cache_kwargs(target, cache))
        began = time.perf_counter()
        for _ in range(20):
            target(input_ids=ids[:, -5:], **cache_kwargs(target, cache))
            crop(cache, 195)
        forward = (time.perf_counter() - began) / 20
    print(f"target verification forward (5 tokens after 195): {forward * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
