"""The hybrid's choice in every round on MT-bench's first three extraction questions, beside
prompt lookup: tau, rounds, what the rule chose, and how often it passed over an offered prompt
lookup copy. SmolLM2-135M-Instruct with the zoo's `eagle3-smollm2-135m-instruct`, chains of 4,
T = 0, 128 new tokens, 2 threads, one process; the rule by pace (as served) and by scores (no
clock). Diagnostic for the hybrid's extraction loss: tau and counts, no timing.

    python bench/results/cpu-2026-12-06-hybrid-extraction-choices/choices.py
"""

from __future__ import annotations

import collections
from dataclasses import replace

import torch

import draftzoo.inference.proposers.hybrid as hybrid_module
from draftzoo.architectures.zoo_index import resolve_drafter
from draftzoo.eval.runner import EvalConfig, load_prompts
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.load import load_drafter, load_target
from draftzoo.inference.proposal_settings import ProposalSettings
from draftzoo.inference.proposers.hybrid_rule import HybridSettings
from draftzoo.inference.proposers.prompt_lookup import prompt_lookup_runtime
from draftzoo.inference.sampling import SamplingParams

ROUNDS: list[tuple[str, list[str]]] = []  # (choice, the sources offered) of each round


def _logged(choose):
    def logged(calibration, candidates, settings):
        choice = choose(calibration, candidates, settings)
        ROUNDS.append((choice.kind, [c.source for c in candidates]))
        return choice

    return logged


def main() -> None:
    torch.set_num_threads(2)
    hybrid_module.choose = _logged(hybrid_module.choose)
    target, tokenizer = load_target("smollm2-135m-instruct")
    config = EvalConfig(prompt_sets=("mt-bench",), max_prompts=80)
    prompts = [p for p in load_prompts(config) if p.category == "extraction"][:3]
    folder = resolve_drafter("eagle3-smollm2-135m-instruct")[0]
    chain = ProposalSettings(num_speculative_tokens=4)
    params = SamplingParams(max_new_tokens=128)
    rules = (("lookup", None), ("pace", HybridSettings()), ("scores", HybridSettings(pace=False)))
    for name, rule in rules:
        if rule is None:
            runtime = prompt_lookup_runtime(None, chain)
        else:
            runtime = load_drafter(folder, target, tokenizer, replace(chain, hybrid=rule))
        generator = SpeculativeGenerator(target, tokenizer, runtime.make_proposer(), 4)
        for prompt in prompts:
            ROUNDS.clear()
            metrics = generator.generate(prompt.render(tokenizer, True), params).metrics
            tau = metrics.num_generated_tokens / metrics.num_target_forwards
            kinds = dict(collections.Counter(kind for kind, _ in ROUNDS))
            offered = [kind for kind, sources in ROUNDS if "lookup" in sources]
            passed = sum(1 for kind in offered if kind not in ("lookup", "both"))
            print(
                f"{name:7} {prompt.prompt_id:4} tau {tau:.2f} rounds {metrics.num_target_forwards}"
                f" choices {kinds} lookup offered {len(offered)}, passed over {passed}"
            )


if __name__ == "__main__":
    main()
