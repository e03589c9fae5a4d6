"""A drafter over the target's head (EAGLE-1, MTP, DFlash) or a draft LM copied with another
drafter's draft vocabulary: what truncating the head at export costs in acceptance and saves a
round.

    python bench/target_head_vocab.py recipes/zoo/mtp-smollm2-135m-instruct \
        runs/mtp-smollm2-vocab8k --vocab-from recipes/zoo/eagle3-smollm2-135m-instruct
    python bench/drafter_bench.py --target smollm2-135m-instruct --chains-only \
        --drafter recipes/zoo/mtp-smollm2-135m-instruct --drafter runs/mtp-smollm2-vocab8k

The copy keeps every weight; it gains `d2t`/`t2d` and `draft_vocab_size` (a draft LM: the map
in `draft_vocab.safetensors`, named by its record), exactly what training with
`<family>.draft_vocab_size` installs at export (train/draft_vocab.py) when the map comes from
a drafter trained on the same data with the same size (the SmolLM2 recipes all read
runs/smollm2-data/train.jsonl; EAGLE-3's map is its 8,192 most frequent supervised tokens).
The copy is loaded back through its family's loader before it is kept.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from bench_target import load_target
from safetensors.torch import load_file, save_file

from draftzoo.architectures.draft_lm import vocab_map_bytes
from draftzoo.architectures.drafter_io import DRAFT_VOCAB_FILE, RECORD_FILE, read_drafter_record
from draftzoo.architectures.target_head import MAP_KEYS, check_vocab_map
from draftzoo.inference.load import load_drafter

FAMILIES = ("eagle1", "mtp", "dflash", "draft_lm")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafter", type=Path, help="an EAGLE-1, MTP or DFlash drafter folder")
    parser.add_argument("output", type=Path, help="a new folder for the copy")
    parser.add_argument("--vocab-from", type=Path, required=True, help="a drafter with d2t/t2d")
    args = parser.parse_args()
    if args.output.exists():
        raise SystemExit(f"{args.output} exists; name a new folder")
    record = read_drafter_record(args.drafter)
    if record["family"] not in FAMILIES:
        raise SystemExit(f"{args.drafter} is a {record['family']} drafter, not {FAMILIES}")
    source = load_file(args.vocab_from / "model.safetensors")
    if not set(MAP_KEYS) <= set(source):
        raise SystemExit(f"{args.vocab_from} holds no draft vocabulary map")
    config = json.loads((args.drafter / "config.json").read_text())
    check_vocab_map(source["d2t"], source["t2d"], config["vocab_size"], str(args.vocab_from))
    tensors = load_file(args.drafter / "model.safetensors")
    if set(MAP_KEYS) & set(tensors) or "draft_vocab_file" in record:
        raise SystemExit(f"{args.drafter} has a draft vocabulary already")
    partial = args.output.with_name(args.output.name + ".partial")
    shutil.copytree(args.drafter, partial)
    if record["family"] == "draft_lm":
        (partial / DRAFT_VOCAB_FILE).write_bytes(vocab_map_bytes(source["d2t"], source["t2d"]))
        record["draft_vocab_file"] = DRAFT_VOCAB_FILE
        record["training"]["draft_vocab_size"] = len(source["d2t"])
        (partial / RECORD_FILE).write_text(json.dumps(record, indent=1))
    else:
        config["draft_vocab_size"] = len(source["d2t"])
        (partial / "config.json").write_text(json.dumps(config, indent=1))
        maps = {k: source[k] for k in MAP_KEYS}
        save_file({**tensors, **maps}, str(partial / "model.safetensors"))
    tokenizer, model = load_target(record["recipe"]["target"]["path"])
    load_drafter(partial, model, tokenizer)  # refuses what its family would not load
    partial.rename(args.output)
    print(f"{args.output}: {record['family']} over {len(source['d2t'])} of {config['vocab_size']}")


if __name__ == "__main__":
    main()
