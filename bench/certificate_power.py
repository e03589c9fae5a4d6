"""Does the losslessness certificate catch lossy acceptance on a real checkpoint?

    python bench/certificate_power.py eagle1-testbed-small --threads 2
    python bench/certificate_power.py medusa1-testbed-small --tree --threads 2

Runs the certificate (`draftzoo.eval.certificate`, default size: 4 prompts x 4,000 decodes of
3 tokens at T = 1, false-alarm rate 0.001) on the drafter three ways: the exact runtime, Medusa's
typical acceptance, and a rule that accepts every draft (the first path of the proposal, then
a token sampled from the target). Prints, per rule, each prompt's TV and threshold and the
verdict. The first should pass; the other two are lossy and should fail.
"""

from __future__ import annotations

import argparse
import time

import torch

from draftzoo.eval.certificate import CertificateConfig, accept_every_draft, certify, describe
from draftzoo.eval.runner import EvalConfig, load_prompts
from draftzoo.inference import round as runtime_round
from draftzoo.inference.load import load_drafter, load_target, resolve_drafter
from draftzoo.inference.proposal_settings import OWN_TREE, ProposalSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafter", help="a drafter folder or zoo name")
    parser.add_argument("--tree", action="store_true", help="serve its tree (EAGLE, Medusa)")
    parser.add_argument("--samples", type=int, default=CertificateConfig.samples)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    folder, _ = resolve_drafter(args.drafter)
    target, tokenizer = load_target("testbed-small")
    proposal = ProposalSettings(tree=OWN_TREE if args.tree else None)
    config = EvalConfig(prompt_sets=("humaneval", "stdlib-heldout"), max_prompts=12)
    runtime = load_drafter(folder, target, tokenizer, proposal)
    texts = [p.render(tokenizer, True) for p in load_prompts(config)[1:]]
    settings = CertificateConfig(samples=args.samples)
    exact_accept = runtime_round.accept
    for rule in ("exact", "typical", "accept every draft"):
        runtime_round.accept = accept_every_draft if rule == "accept every draft" else exact_accept
        began = time.perf_counter()
        acceptance = "typical" if rule == "typical" else "exact"
        result = certify(target, tokenizer, runtime.make_proposer, texts, settings, acceptance)
        seconds = time.perf_counter() - began
        print(f"{rule}: {describe(result)} ({seconds:.0f} s)")
        for row in result["per_prompt"]:
            print(
                f"  prompt {row['prompt']}: TV {row['tv']:.4f} threshold {row['threshold']:.4f} "
                f"bins {row['bins']} rest mass {row['rest_mass']:.3f} "
                f"{'pass' if row['passed'] else 'FAIL'}"
            )
    runtime_round.accept = exact_accept


if __name__ == "__main__":
    main()
