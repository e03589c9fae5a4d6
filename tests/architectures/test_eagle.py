"""EAGLE drafters: training-time test matches step-by-step drafting; build-time checks."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from draftzoo.architectures.eagle import DraftCache, EagleConfig, build_eagle
from draftzoo.architectures.target import TargetAdapter, TargetError
from draftzoo.data.draft_vocab import DraftVocabError, build_vocab_map


def tiny_target(layers: int = 6, hidden: int = 64, vocab: int = 97) -> TargetAdapter:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return TargetAdapter(LlamaForCausalLM(config).eval())


def causal(s: int) -> torch.Tensor:
    return torch.tril(torch.ones(s, s, dtype=torch.bool))[None, None]


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_ttt_step_j_equals_drafting_j_steps_ahead(kind):
    """Step j's output at t equals drafting from position t with a cache holding exactly the
    step-0 keys 0..t and the keys of its own steps 1..j (teacher-forced tokens)."""
    target = tiny_target()
    steps = 4 if kind == "eagle3" else 1
    drafter = build_eagle(EagleConfig(kind=kind, ttt_steps=steps), target).eval()
    torch.manual_seed(1)
    s, width = 12, 3 * 64 if kind == "eagle3" else 64
    ids = torch.randint(0, 97, (1, s))
    g0 = drafter.fuse(torch.randn(1, s, width))
    positions = torch.arange(s)[None]
    with torch.no_grad():
        unrolled = drafter.ttt_unroll(ids, g0, positions, causal(s), steps)
        for t in range(s - steps):
            cache = DraftCache()
            prefix = t + 1
            h = drafter.extend(
                ids[:, 1 : prefix + 1], g0[:, :prefix], positions[:, :prefix], cache, causal(prefix)
            )
            torch.testing.assert_close(h[:, t], unrolled[0][:, t], atol=1e-5, rtol=1e-5)
            g = h[:, t : t + 1]
            for j in range(1, steps):
                mask = torch.ones(1, 1, 1, len(cache) + 1, dtype=torch.bool)
                g = drafter.extend(
                    ids[:, t + 1 + j : t + 2 + j], g, torch.tensor([[t + j]]), cache, mask
                )
                torch.testing.assert_close(g[:, 0], unrolled[j][:, t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_ttt_on_packed_rows_equals_each_sample_alone(kind):
    """Training rows pack several conversations: under the training mask (`attention_allowed`)
    and restarting positions, every step's output at every scored position of a packed row
    (and of a padded row beside it) equals the unroll of its sample alone."""
    from draftzoo.data.batching import collate
    from draftzoo.train.eagle_losses import attention_allowed, real_positions

    target = tiny_target()
    steps = 4 if kind == "eagle3" else 1
    drafter = build_eagle(EagleConfig(kind=kind, ttt_steps=steps), target).eval()
    width = 3 * 64 if kind == "eagle3" else 64
    torch.manual_seed(4)
    samples = [torch.randint(0, 97, (n,)) for n in (9, 14, 7, 11)]
    features = [torch.randn(n, width) for n in (9, 14, 7, 11)]
    rows = [
        {"input_ids": torch.cat(samples[:3]).tolist(), "lengths": [9, 14, 7]},
        {"input_ids": samples[3].tolist(), "lengths": [11]},
    ]
    for index, row in enumerate(rows):
        row.update(loss_mask=[1] * len(row["input_ids"]), index=index)
    batch = collate(rows, pad_token_id=0)
    assert batch.packed and batch.input_ids.shape == (2, 30)
    states = torch.zeros(2, 30, width)
    states[0] = torch.cat(features[:3])
    states[1, :11] = features[3]
    with torch.no_grad():
        packed = drafter.ttt_unroll(
            batch.input_ids,
            drafter.fuse(states),
            batch.position_ids,
            attention_allowed(batch),
            steps,
        )
        starts = [(0, 0), (0, 9), (0, 23), (1, 0)]
        for ids, f, (row, start) in zip(samples, features, starts, strict=True):
            n = len(ids)
            alone = drafter.ttt_unroll(
                ids[None], drafter.fuse(f[None]), torch.arange(n)[None], causal(n), steps
            )
            for j in range(steps):
                scored = real_positions(batch, 2 + j)[row, start : start + n]
                assert int(scored.sum()) == n - 2 - j
                torch.testing.assert_close(
                    packed[j][row, start : start + n][scored], alone[j][0][scored]
                )


def test_ttt_with_one_step_is_plain_training():
    target = tiny_target()
    drafter = build_eagle(EagleConfig(kind="eagle3", ttt_steps=1), target).eval()
    torch.manual_seed(2)
    ids, g0 = torch.randint(0, 97, (2, 10)), drafter.fuse(torch.randn(2, 10, 192))
    positions = torch.arange(10)[None].expand(2, -1)
    with torch.no_grad():
        (only,) = drafter.ttt_unroll(ids, g0, positions, causal(10), 1)
        for row in range(2):  # one causal pass over an empty cache: the plain layer
            plain = drafter.extend(
                ids[row : row + 1, 1:],
                g0[row : row + 1, :9],
                positions[:1, :9],
                DraftCache(),
                causal(9),
            )
            torch.testing.assert_close(only[row : row + 1, :9], plain)


def test_ttt_step_sees_no_other_positions_of_later_steps():
    """Changing the input token at position u of step >= 1 changes step-j outputs only at u."""
    target = tiny_target()
    drafter = build_eagle(EagleConfig(kind="eagle3", ttt_steps=3), target).eval()
    torch.manual_seed(3)
    ids, g0 = torch.randint(0, 97, (1, 10)), drafter.fuse(torch.randn(1, 10, 192))
    positions = torch.arange(10)[None]
    with torch.no_grad():
        before = drafter.ttt_unroll(ids, g0, positions, causal(10), 3)
        changed = ids.clone()
        changed[0, 6] = (changed[0, 6] + 1) % 97  # read by step 1 at t=4 and step 2 at t=3
        after = drafter.ttt_unroll(changed, g0, positions, causal(10), 3)
    # step 0 reads x_{t+1}: position 5 and every later one (causal) may change
    assert torch.equal(before[0][:, :5], after[0][:, :5])
    diff1 = (before[1] - after[1]).abs().amax(-1)[0]
    moved = [t for t in range(10) if diff1[t] > 0]
    assert 4 in moved and all(t >= 4 for t in moved)


def test_build_refuses_missing_layers_and_oversized_vocab():
    target = tiny_target(layers=6)
    with pytest.raises(TargetError, match="do not exist"):
        build_eagle(EagleConfig(kind="eagle3", layers=(2, 3, 9)), target)
    with pytest.raises(TargetError, match="exceeds"):
        build_eagle(EagleConfig(kind="eagle3", draft_vocab_size=500), target)
    with pytest.raises(DraftVocabError, match="larger than the 3 distinct"):
        build_vocab_map(torch.tensor([5, 0, 2, 0, 1]), 4)


def test_vocab_map_round_trips():
    d2t, t2d = build_vocab_map(torch.tensor([5, 0, 2, 0, 1, 9]), 3)
    assert t2d.tolist() == [True, False, True, False, False, True]
    assert (torch.arange(3) + d2t).tolist() == [0, 2, 5]


def test_untrained_eagle3_head_is_the_targets_head_on_the_draft_vocabulary():
    """`init_draft_head` copies the final norm with the lm_head rows: for any state the draft
    logits equal the target's logits at the draft vocabulary's tokens."""
    from draftzoo.architectures.eagle import init_draft_head

    target = tiny_target()
    with torch.no_grad():
        target.final_norm.weight.uniform_(0.5, 2.0)  # a trained-looking norm, not ones
    drafter = build_eagle(EagleConfig(kind="eagle3", draft_vocab_size=40), target)
    counts = torch.zeros(97)
    counts[torch.randperm(97)[:40]] = torch.arange(40, 0, -1).float()
    d2t, t2d = build_vocab_map(counts, 40)
    drafter.set_vocab_map(d2t, t2d)
    init_draft_head(drafter, target)
    hidden = torch.randn(3, 5, 64)
    with torch.no_grad():
        expected = target.lm_head(target.final_norm(hidden))[..., t2d]
        torch.testing.assert_close(drafter.logits(hidden), expected)
