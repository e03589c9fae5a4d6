"""The losslessness certificate on real (tiny) checkpoints: the exact runtime passes it, an
accept-every-draft rule and Medusa's typical acceptance fail it, and publish refuses both a
failed certificate and a report without one; `draftzoo certify` adds one to a report."""

from __future__ import annotations

import itertools
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from draftzoo.cli import main
from draftzoo.eval.certificate import CertificateConfig, accept_every_draft, certify, exact_bins
from draftzoo.eval.publish import PublishError, publish
from draftzoo.eval.runner import EvalConfig, evaluate, write_report
from draftzoo.inference import round as runtime_round
from draftzoo.inference.load import load_drafter
from draftzoo.inference.proposal_settings import from_name
from draftzoo.inference.sampling import SamplingParams, probabilities

SETTINGS = CertificateConfig(prompts=2, samples=1500)


def test_exact_bins_are_the_targets_joint_probabilities():
    """Against products of the target's conditionals computed one sequence at a time."""
    from tests.conftest import tiny_causal_lm

    model = tiny_causal_lm("llama", vocab_size=8, layers=2)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    prompt, config = [1, 4, 2], CertificateConfig(samples=400, tokens=2)
    bins = exact_bins(model, prompt, config, eos=frozenset({7}))
    params = SamplingParams(temperature=1.0)
    floor = config.min_expected / config.samples
    with torch.no_grad():
        for seq in itertools.product(range(8), repeat=2):
            logits = model(input_ids=torch.tensor([prompt + list(seq)])).logits[0]
            probs = probabilities(logits[len(prompt) - 1 : -1], params)
            first = probs[0, seq[0]].item()
            if seq[0] == 7:  # EOS ends the outcome after one token
                assert math.isclose(bins[(7,)], first, rel_tol=1e-4) == (first >= floor)
                continue
            joint = first * probs[1, seq[1]].item()
            assert (seq in bins) == (joint >= floor and first >= floor)
            if seq in bins:
                assert math.isclose(bins[seq], joint, rel_tol=1e-4)
    assert 0 < sum(bins.values()) <= 1 + 1e-6


def test_the_exact_runtime_passes_and_lossy_rules_fail(monkeypatch):
    """On a sharp 6-token target with a confidently wrong draft LM: exact acceptance passes,
    Medusa's typical acceptance and an accept-every-draft rule fail."""
    from draftzoo.inference.proposers.draft_lm import DraftModelProposer
    from tests.inference.test_lossless_sampling import _tiny_lm

    target, draft = _tiny_lm(seed=0, sharpness=30.0), _tiny_lm(seed=7, sharpness=60.0)
    prompts = [[1, 4], [3, 2, 5]]

    def check(acceptance="exact"):
        return certify(
            target, None, lambda: DraftModelProposer(draft), prompts, SETTINGS, acceptance
        )

    exact = check()
    assert exact["passed"] and exact["drafts_used"], exact["per_prompt"]
    assert exact["max_tv_over_threshold"] < 1
    typical = check("typical")
    assert not typical["passed"] and typical["max_tv_over_threshold"] > 1.5, typical["per_prompt"]
    monkeypatch.setattr(runtime_round, "accept", accept_every_draft)
    forced = check()
    assert not forced["passed"] and forced["max_tv_over_threshold"] > 1.5, forced["per_prompt"]


def _evaluated(tiny_drafters, tiny_target_model, out: Path, samples: int) -> Path:
    model, tokenizer, path = tiny_target_model
    drafter = load_drafter(tiny_drafters["draft_lm"], model, tokenizer, from_name("chain", 3))
    config = EvalConfig(
        max_prompts=4,
        max_new_tokens=8,
        temperatures=(0.0,),
        chat=False,  # code prompts: testbed-tiny is sharper there than after a chat turn
        certificate_samples=samples,
        certificate_prompts=4,
    )
    report = evaluate(model, tokenizer, drafter, config, str(path), show_progress=False)
    return write_report(report, out)


def test_publish_refuses_a_failed_or_missing_certificate_and_certify_adds_one(
    tiny_drafters, tiny_target_model, tmp_path, monkeypatch, capsys
):
    folder = tiny_drafters["draft_lm"]
    zoo = tmp_path / "zoo"
    with monkeypatch.context() as patch:
        patch.setattr(runtime_round, "accept", accept_every_draft)
        forced = _evaluated(tiny_drafters, tiny_target_model, tmp_path / "forced", 1500)
    assert not json.loads(forced.read_text())["certificate"]["passed"]
    with pytest.raises(PublishError, match="certificate FAILED"):
        publish(folder, forced, zoo)
    missing = _evaluated(tiny_drafters, tiny_target_model, tmp_path / "missing", 0)
    assert json.loads(missing.read_text())["certificate"] is None
    with pytest.raises(PublishError, match="no losslessness certificate"):
        publish(folder, missing, zoo)
    assert not zoo.exists()
    # the same report, certified afterwards by the CLI, then published with the figures
    target = str(tiny_target_model[2])
    args = ["certify", str(folder), "--report", str(missing.parent), "--target", target]
    assert main([*args, "--samples", "1500", "--prompts", "4"]) == 0
    assert "certificate PASSED" in capsys.readouterr().out
    certified = json.loads(missing.read_text())
    assert certified["certificate"]["passed"]
    assert certified["config"]["certificate_samples"] == 1500
    published = publish(folder, missing, zoo)
    card = (published / "README.md").read_text()
    assert "## Losslessness certificate" in card and "PASSED" in card
    assert "**Budget**: " in card and " supervised tokens in 6 steps" in card
    entry = json.loads((zoo / "index.json").read_text())["drafters"][published.name]
    assert entry["certificate"]["passed"] and entry["certificate"]["samples"] == 1500


def test_certify_refuses_a_report_of_another_checkpoint(tiny_drafters, tmp_path, capsys):
    report = tmp_path / "eval" / "report.json"
    report.parent.mkdir()
    report.write_text(json.dumps({"checkpoint": {"sha256": "0" * 64}}))
    copy = shutil.copytree(tiny_drafters["eagle1"], tmp_path / "drafter")
    assert main(["certify", str(copy), "--report", str(report)]) == 2
    assert "measured another checkpoint" in capsys.readouterr().err
