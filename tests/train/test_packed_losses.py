"""Packed rows train like the same samples one per row: every family gives the same summed loss
and the same supervised count on both layouts (DFlash with every eligible anchor drawn;
Medusa-2 through its adapted target)."""

from __future__ import annotations

import pytest
import torch

from draftzoo.data.batching import collate
from draftzoo.data.capture import OnlineFeatures
from draftzoo.data.token_dataset import build_token_dataset
from draftzoo.train.setup import load_target
from tests.train import helpers


def _draft_lm(recipe, target):
    from draftzoo.architectures.draft_lm import build_draft_lm
    from draftzoo.train.draft_lm_loss import DraftLMLoss

    return build_draft_lm(recipe.draft, target.model), DraftLMLoss


def _eagle(recipe, target):
    from draftzoo.architectures.eagle import build_eagle
    from draftzoo.train.eagle_batch import EagleLoss

    drafter = build_eagle(recipe.eagle, target)
    return drafter, lambda config, target, features: EagleLoss(config, drafter, target, features)


def _medusa(recipe, target):
    from draftzoo.architectures.medusa import build_medusa
    from draftzoo.train.medusa_loss import MedusaLoss

    heads = build_medusa(recipe.medusa, target)
    with torch.no_grad():  # away from the zero init, so every head's loss depends on its input
        for block in heads.blocks:
            block.layers[0].weight.normal_(0, 0.02)
    n = recipe.medusa.num_heads
    return heads, lambda config, target, features: MedusaLoss(config, n, target, features)


def _mtp(recipe, target):
    from draftzoo.architectures.mtp import build_mtp
    from draftzoo.train.mtp_loss import MtpLoss

    return build_mtp(recipe.mtp, target), MtpLoss


def _dflash(recipe, target):
    from draftzoo.architectures.dflash import build_dflash
    from draftzoo.train.dflash_loss import DflashLoss

    drafter = build_dflash(recipe.dflash, target)
    # every eligible position is an anchor on both layouts (the recipe draws more than exist),
    # so the blocks are the same whatever the draw's seed
    return drafter, lambda config, target, features: DflashLoss(
        config, drafter, target, features, 0
    )


def _medusa2(recipe, target):
    from draftzoo.architectures.lora_adapter import attach_lora
    from draftzoo.architectures.medusa import build_medusa
    from draftzoo.train.medusa2_loss import Medusa2Loss
    from draftzoo.train.medusa2_model import AdaptedTargetHeads

    heads = build_medusa(recipe.medusa, target, "medusa2")
    model = AdaptedTargetHeads(target, attach_lora(target.model, recipe.lora), heads)
    with torch.no_grad():  # the adapter and blocks away from their zero init
        for name, parameter in model.named_parameters():
            if "lora_B" in name or "blocks." in name:
                parameter.normal_(0, 0.02)
    model.eval()  # LoRA dropout off: the two layouts see the same adapter
    return model, lambda config, target, features: Medusa2Loss(config, model)


FAMILIES = {
    "draft_lm": (helpers.tiny_recipe, "distill", _draft_lm),
    "eagle1": (lambda *a: helpers.tiny_eagle_recipe(*a, eagle={"kind": "eagle1"}), "eagle", _eagle),
    "eagle3": (helpers.tiny_eagle_recipe, "eagle", _eagle),
    "medusa1": (helpers.tiny_medusa_recipe, "loss", _medusa),
    "mtp": (lambda *a: helpers.tiny_mtp_recipe(*a, mtp={"depth": 2}), "mtp", _mtp),
    "dflash": (
        lambda *a: helpers.tiny_dflash_recipe(*a, dflash={"anchors_per_row": 4096}),
        "dflash",
        _dflash,
    ),
    "medusa2": (helpers.tiny_medusa2_recipe, "loss", _medusa2),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_packed_row_gives_the_loss_of_its_samples_one_per_row(family, testbed_tiny, tmp_path):
    from dataclasses import replace

    chat = helpers.write_chat_jsonl(tmp_path / "chat.jsonl", 12)
    make_recipe, section, build = FAMILIES[family]
    recipe = make_recipe(tmp_path, testbed_tiny[0], chat)
    data = replace(recipe.data, packing=False, max_length=512)
    target = load_target(recipe.target, "cpu")
    samples, _, _ = build_token_dataset(data, target.tokenizer, tmp_path / "cache")
    rows = [samples[i] for i in range(3)]
    pad = target.tokenizer.pad_token_id or 0
    packed_row = {
        "input_ids": [t for r in rows for t in r["input_ids"]],
        "loss_mask": [m for r in rows for m in r["loss_mask"]],
        "lengths": [len(r["input_ids"]) for r in rows],
        "index": 0,
    }
    torch.manual_seed(0)
    model, loss_class = build(recipe, target)
    features = OnlineFeatures(target, recipe.capture_layers(target.num_layers), "float32")
    loss = loss_class(getattr(recipe, section), target, features)
    results = []
    for batch in (collate([packed_row], pad), collate(rows, pad)):
        assert batch.packed == (batch.input_ids.shape[0] == 1)
        total, _ = loss(model, batch, loss.teacher(batch))
        results.append((total, loss.supervised(batch)))
    (packed, packed_count), (separate, separate_count) = results
    assert int(packed_count) == int(separate_count) > 0 and separate > 0
    torch.testing.assert_close(packed, separate, rtol=1e-4, atol=1e-3)
