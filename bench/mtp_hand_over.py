"""Tau of one MTP drafter under both hand-over conventions, on its card's prompts and settings.

    python bench/mtp_hand_over.py [--drafter mtp-testbed-small] [--output-dir DIR]

`normed` (transformers' MtpLayer, SGLang's deepseek_nextn) hands the post-norm state to the next
draft step; `residual` (vLLM's deepseek_mtp) hands over the block's output before the norm and
zeroes the embedding at position 0 (docs/mtp.md). The drafter is evaluated as it was trained and
as the other convention's engine would draft with the same weights: tau at T = 0 and T = 1 and
greedy identity, on the prompts, chain length and seed its card's report names (no certificate,
one repeat). Tau does not depend on the clock; the speedups printed beside it are only as good
as the machine was quiet (the report's timing verdict says).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from draftzoo.architectures.mtp import HAND_OVERS, load_mtp
from draftzoo.architectures.target import TargetAdapter
from draftzoo.architectures.zoo_index import resolve_drafter
from draftzoo.eval.runner import EvalConfig, evaluate
from draftzoo.inference.drafter_request import DrafterRequest
from draftzoo.inference.drafter_runtime import DrafterRuntime
from draftzoo.inference.load import load_target, recorded_target
from draftzoo.inference.proposers.mtp import MtpProposer


def runtime(folder: Path, record: dict, model, tokenizer, hand_over: str, proposal):
    """The drafter's runtime with its modules run in `hand_over` (`proposal`: a chain)."""
    drafter = load_mtp(folder, TargetAdapter(model, tokenizer), model.dtype, record, hand_over)
    cache = DrafterRequest().cache
    return DrafterRuntime(folder, record, drafter, lambda: MtpProposer(drafter, cache), proposal)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", default="mtp-testbed-small")
    parser.add_argument("--output-dir", type=Path, default=None)
    args = parser.parse_args()
    folder, _ = resolve_drafter(args.drafter)
    record = json.loads((folder / "draftzoo.json").read_text())
    report = json.loads((folder / "report.json").read_text())
    config = replace(EvalConfig.from_report(report), certificate_samples=0, repeats=1)
    trained = json.loads((folder / "config.json").read_text()).get("mtp_hand_over", "normed")
    model, tokenizer = load_target(recorded_target(record))
    rows = {}
    for hand_over in HAND_OVERS:
        drafter = runtime(folder, record, model, tokenizer, hand_over, config.proposal)
        measured = evaluate(model, tokenizer, drafter, config, report["target"]["name"])
        rows[hand_over] = measured
        if args.output_dir:
            args.output_dir.mkdir(parents=True, exist_ok=True)
            out = args.output_dir / f"report-{hand_over}.json"
            out.write_text(json.dumps(measured, indent=1))
    print(
        f"{args.drafter}: trained with hand_over {trained}; chains of "
        f"{config.num_speculative_tokens}, {', '.join(config.prompt_sets)}, "
        f"{config.max_prompts} prompts each, {config.max_new_tokens} new tokens"
    )
    print("hand_over  T    tau    identity  speedup  timing")
    for hand_over, measured in rows.items():
        timing = measured["timing"]
        verdict = "reliable" if timing["reliable"] else f"UNRELIABLE: {timing['why_unreliable']}"
        for result in measured["results"]:
            identity = result.get("greedy_identity")
            shown = f"{identity['identical']}/{identity['decodes']}" if identity else "-"
            print(
                f"{hand_over:9}  {result['temperature']:<4g} {result['tau']:.3f}  "
                f"{shown:9} {result['speedup']['mean']:.2f}x    {verdict}"
            )


if __name__ == "__main__":
    main()
