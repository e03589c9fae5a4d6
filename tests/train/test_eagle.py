"""The EAGLE recipes: real steps on testbed-tiny, export and load, DDP, bad input."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draftzoo.architectures.config_io import ConfigError, from_dict
from draftzoo.architectures.drafter_io import read_drafter_record
from draftzoo.architectures.eagle import load_eagle
from draftzoo.architectures.target import FingerprintMismatchError, TargetError
from draftzoo.data.draft_vocab import DraftVocabError
from draftzoo.train.eagle import EagleRecipe, run
from draftzoo.train.setup import load_target
from tests.train.helpers import (
    launch_two_processes,
    recipe_yaml,
    tiny_eagle_recipe,
    write_chat_jsonl,
)


@pytest.fixture(scope="module")
def chat(tmp_path_factory) -> Path:
    return write_chat_jsonl(tmp_path_factory.mktemp("chat") / "chat.jsonl", 48)


def _untrained_final_loss(path: Path, target_dir, chat: Path, steps: int, eagle: dict) -> float:
    """The final loss of the same recipe at lr 0: the same batches through the untrained drafter."""
    train = {"max_steps": steps, "lr": 0.0, "checkpoint_every": 50}
    return run(tiny_eagle_recipe(path, target_dir, chat, eagle=eagle, train=train)).final_loss


def test_eagle3_trains_exports_and_loads_back(testbed_tiny, chat, tmp_path):
    eagle = {"draft_vocab_size": 200}
    recipe = tiny_eagle_recipe(
        tmp_path,
        testbed_tiny[0],
        chat,
        eagle=eagle,
        train={"max_steps": 12, "lr": 3e-3, "log_every": 2, "checkpoint_every": 50},
    )
    result = run(recipe)
    folder = Path(recipe.output_dir)
    record = read_drafter_record(folder)
    target = load_target(recipe.target, "cpu")
    assert record["family"] == "eagle3" and record["hidden_state_layers"] == [0, 1, 2]
    training = record["training"]
    assert len(training["ttt_accuracy"]) == 3 and training["steps"] == 12
    assert 1.0 <= training["simulated_acceptance_length"] <= 4.0
    assert 0 < result.final_loss < 50 and result.supervised_tokens > 0
    assert result.data_passes > 0
    assert training["data_passes"] == pytest.approx(result.data_passes, abs=1e-4)
    seconds = training["train_seconds"]  # rounded to 0.1 s
    rate = training["supervised_tokens_per_second"]  # rounded to 0.1 token/s
    assert result.supervised_tokens / (seconds + 0.05) <= rate + 0.05
    assert rate - 0.05 <= result.supervised_tokens / max(seconds - 0.05, 1e-3)
    assert training["peak_memory_mb"] > 0 and training["peak_memory_kind"] == "process RSS"
    per_token = 3 * target.hidden_size * 2  # taps 0, 1 and the final state 2, bf16
    assert training["capture"] == f"online, bfloat16, {per_token} bytes per token (nothing stored)"
    weights = load_file(folder / "model.safetensors")
    assert weights["d2t"].dtype == torch.int64 and weights["d2t"].shape == (200,)
    assert weights["t2d"].dtype == torch.bool and int(weights["t2d"].sum()) == 200
    assert weights["lm_head.weight"].shape == (200, target.hidden_size)
    assert weights["fc.weight"].shape == (target.hidden_size, 3 * target.hidden_size)
    assert weights["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * target.hidden_size
    assert not any(k.startswith(("embed_tokens", "rotary")) for k in weights)
    drafter = load_eagle(folder, target)
    assert torch.equal(drafter.d2t, weights["d2t"])
    # the loss fell below that of the same batches through the untrained drafter
    untrained = _untrained_final_loss(tmp_path / "fresh", testbed_tiny[0], chat, 12, eagle)
    assert untrained > result.final_loss


def test_eagle1_trains_and_loads_back(testbed_tiny, chat, tmp_path):
    recipe = tiny_eagle_recipe(
        tmp_path, testbed_tiny[0], chat, eagle={"kind": "eagle1", "feature_noise": 0.1}
    )
    run(recipe)
    folder = Path(recipe.output_dir)
    target = load_target(recipe.target, "cpu")
    assert read_drafter_record(folder)["hidden_state_layers"] == [target.num_layers]
    weights = load_file(folder / "model.safetensors")
    assert weights["fc.weight"].shape == (target.hidden_size, 2 * target.hidden_size)
    # no fc bias by default (vLLM's EAGLE-1 layout); the lm_head is the target's
    assert "fc.bias" not in weights and "lm_head.weight" not in weights
    assert "midlayer.input_layernorm.weight" not in weights
    drafter = load_eagle(folder, target)
    assert drafter.kind == "eagle1"


def test_eagle3_ddp_ranks_hold_identical_weights(testbed_tiny, chat, tmp_path):
    recipe = tiny_eagle_recipe(
        tmp_path,
        testbed_tiny[0],
        chat,
        train={"max_steps": 2, "micro_batch_size": 2, "checkpoint_every": 10},
    )
    path = recipe_yaml(recipe, tmp_path / "ddp.yaml")
    proc = launch_two_processes(path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    work = Path(f"{recipe.output_dir}.work")
    digests = json.loads((work / "replicas.json").read_text())["digests"]
    assert len(digests) == 2 and digests[0] == digests[1]


def test_bad_eagle_input_fails_before_step_one(testbed_tiny, chat, tmp_path):
    with pytest.raises(TargetError, match="do not exist"):
        run(tiny_eagle_recipe(tmp_path / "a", testbed_tiny[0], chat, eagle={"layers": [1, 2, 40]}))
    with pytest.raises(DraftVocabError, match="distinct tokens"):
        run(
            tiny_eagle_recipe(
                tmp_path / "b", testbed_tiny[0], chat, eagle={"draft_vocab_size": 1000}
            )
        )
    assert not (tmp_path / "a" / "drafter").exists() and not (tmp_path / "b" / "drafter").exists()
    data = {"source": str(chat)}
    with pytest.raises(ConfigError, match="must equal family"):
        from_dict(EagleRecipe, {"family": "eagle1", "data": data, "eagle": {"kind": "eagle3"}})
    with pytest.raises(ConfigError, match="ttt_stepz"):
        from_dict(EagleRecipe, {"family": "eagle3", "data": data, "eagle": {"ttt_stepz": 3}})
    # a drafter for one target refuses another one (other hidden size / layer count)
    recipe = tiny_eagle_recipe(tmp_path / "c", testbed_tiny[0], chat, train={"max_steps": 2})
    run(recipe)
    target = load_target(recipe.target, "cpu")
    other = replace(target.fingerprint(), hidden_size=512)

    class OtherTarget:
        def fingerprint(self):
            return other

    with pytest.raises(FingerprintMismatchError, match="hidden_size"):
        load_eagle(Path(recipe.output_dir), OtherTarget())


def test_eagle3_trains_from_offline_capture_like_online(testbed_tiny, chat, tmp_path):
    """`draftzoo capture` stores exactly the recipe's layers; training from the shards gives
    the online run's loss (up to the same bf16 rounding both modes apply)."""
    from draftzoo.cli import main

    online = tiny_eagle_recipe(tmp_path / "on", testbed_tiny[0], chat, train={"max_steps": 2})
    first = run(online).final_loss
    path = recipe_yaml(online, tmp_path / "r.yaml")
    shards = tmp_path / "shards"
    assert main(["capture", str(path), "--dir", str(shards)]) == 0
    index = json.loads((shards / "index.json").read_text())
    assert index["layers"] == [0, 1, 2]  # EAGLE-3 taps (+ the final state, index 2 here)
    offline = replace(
        online,
        output_dir=str(tmp_path / "off" / "drafter"),
        capture=replace(online.capture, mode="offline", dir=str(shards)),
    )
    second = run(offline).final_loss
    assert abs(first - second) / first < 1e-3


def _eagle3_unroll(target, steps: int = 3, s: int = 16):
    """A fresh EAGLE-3 drafter unrolled `steps` training-time-test steps on random inputs:
    (drafter, g0 (a leaf), step outputs, select, eagle3_loss_sums' positional args, whose
    final states are random and read by the target's head)."""
    from draftzoo.architectures.eagle import EagleConfig, build_eagle
    from draftzoo.data.capture import target_logits

    h, vocab = target.hidden_size, target.lm_head.weight.shape[0]
    drafter = build_eagle(EagleConfig(layers=(0, 1, 2), ttt_steps=steps), target)
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (1, s))
    g0 = drafter.fuse(torch.randn(1, s, 3 * h)).detach().requires_grad_()
    select = [torch.arange(s)[None] + 2 + j < s for j in range(steps)]
    allowed = torch.tril(torch.ones(s, s, dtype=torch.bool))[None, None]
    hidden = drafter.ttt_unroll(ids, g0, torch.arange(s)[None], allowed, steps)
    outputs = [x[keep] for x, keep in zip(hidden, select, strict=True)]
    final = torch.randn(1, s, h)
    teacher = partial(target_logits, target)
    args = (outputs, select, final, drafter.logits, teacher, drafter.d2t, drafter.t2d, 0.8)
    return drafter, g0, hidden, select, args


def test_eagle3_feature_alignment_adds_its_term_and_trains(testbed_tiny, chat, tmp_path):
    """`eagle.feature_weight` adds w x decay^j x SmoothL1(rms(h_j,t), rms(g_{t+1+j})) to the
    soft CE, with no gradient into the fused target states; a run with it trains and loads."""
    import torch.nn.functional as F

    from draftzoo.architectures.eagle import EagleConfig
    from draftzoo.train.eagle_losses import eagle3_loss_sums

    target = load_target(tiny_eagle_recipe(tmp_path, testbed_tiny[0], chat).target, "cpu")
    h = target.hidden_size
    _, g0, hidden, select, args = _eagle3_unroll(target)
    plain, _ = eagle3_loss_sums(*args)
    with_aux, stats = eagle3_loss_sums(*args, fused=g0, feature_weight=0.5)
    expected = 0.0
    for j, (x, keep) in enumerate(zip(hidden, select, strict=True)):
        n = int(keep.sum())
        a = F.rms_norm(x[0, :n], (h,))
        b = F.rms_norm(g0[0, 1 + j : 1 + j + n].detach(), (h,))
        expected = expected + 0.8**j * F.smooth_l1_loss(a, b, reduction="none").mean(-1).sum()
    torch.testing.assert_close(with_aux - plain, 0.5 * expected)
    assert stats["feature_loss"][1] == sum(int(k.sum()) for k in select)
    # g0 reaches the aux term only through the drafter's outputs, never as its target
    through_loss = torch.autograd.grad(with_aux - plain, g0, retain_graph=True)[0]
    through_outputs = torch.autograd.grad(0.5 * expected, g0)[0]
    torch.testing.assert_close(through_loss, through_outputs)

    eagle = {"feature_weight": 1.0}
    recipe = tiny_eagle_recipe(
        tmp_path / "run",
        testbed_tiny[0],
        chat,
        eagle=eagle,
        train={"max_steps": 6, "log_every": 2, "checkpoint_every": 50},
    )
    result = run(recipe)
    untrained = _untrained_final_loss(tmp_path / "frozen", testbed_tiny[0], chat, 6, eagle)
    assert 0 < result.final_loss < untrained
    assert read_drafter_record(Path(recipe.output_dir))["recipe"]["eagle"]["feature_weight"] == 1
    load_eagle(Path(recipe.output_dir), target)
    with pytest.raises(ValueError, match="EAGLE-3 only"):
        EagleConfig(kind="eagle1", ttt_steps=1, feature_weight=1.0)
    with pytest.raises(ValueError, match=">= 0"):
        EagleConfig(feature_weight=-1.0)


def test_eagle3_final_feature_regression_adds_its_term_and_trains(testbed_tiny, chat, tmp_path):
    """`eagle.final_feature_weight` adds v x decay^j x SmoothL1(norm(h_j,t), f_{t+1+j}) to the
    soft CE, `norm` the target's final norm (frozen) and f the target's final post-norm state
    whose logits are step j's target; a run with it trains and loads back."""
    import torch.nn.functional as F

    from draftzoo.architectures.eagle import EagleConfig
    from draftzoo.train.eagle_losses import eagle3_loss_sums

    target = load_target(tiny_eagle_recipe(tmp_path, testbed_tiny[0], chat).target, "cpu")
    drafter, _, hidden, select, args = _eagle3_unroll(target)
    final = args[2]
    plain, _ = eagle3_loss_sums(*args)
    with_aux, stats = eagle3_loss_sums(*args, head_norm=target.final_norm, final_feature_weight=0.5)
    expected, count = 0.0, 0
    for j, (x, keep) in enumerate(zip(hidden, select, strict=True)):
        n = int(keep.sum())  # positions 0..n-1; step j predicts from the target's state at t+1+j
        wanted = final[0, 1 + j : 1 + j + n]
        term = F.smooth_l1_loss(target.final_norm(x[0, :n]), wanted, reduction="none")
        term = term.mean(-1)
        expected = expected + 0.8**j * term.sum()
        count += n
    # the difference of two float32 sums of the size of `plain`: rounding at their scale
    atol = 1e-6 * plain.item()  # a few units in the last place of `plain`
    torch.testing.assert_close(with_aux - plain, 0.5 * expected, rtol=1.3e-6, atol=atol)
    assert stats["final_feature_loss"][1] == count
    # the regression trains the drafter's layer and leaves its own head alone
    layer, head = drafter.midlayer.mlp.down_proj.weight, drafter.lm_head.weight
    through_layer, through_head = torch.autograd.grad(
        with_aux - plain, [layer, head], allow_unused=True
    )
    assert through_layer.abs().sum() > 0
    # (the two token losses cancel up to the rounding of their separate head projections)
    assert through_head is None or through_head.abs().max() < 1e-6
    with pytest.raises(ValueError, match="final norm"):
        eagle3_loss_sums(*args, final_feature_weight=0.5)

    eagle = {"final_feature_weight": 1.0}
    recipe = tiny_eagle_recipe(
        tmp_path / "run",
        testbed_tiny[0],
        chat,
        eagle=eagle,
        train={"max_steps": 6, "log_every": 2, "checkpoint_every": 50},
    )
    result = run(recipe)
    untrained = _untrained_final_loss(tmp_path / "frozen", testbed_tiny[0], chat, 6, eagle)
    assert 0 < result.final_loss < untrained
    record = read_drafter_record(Path(recipe.output_dir))
    assert record["recipe"]["eagle"]["final_feature_weight"] == 1
    load_eagle(Path(recipe.output_dir), target)
    with pytest.raises(ValueError, match="EAGLE-3 only"):
        EagleConfig(kind="eagle1", ttt_steps=1, final_feature_weight=1.0)
    with pytest.raises(ValueError, match=">= 0"):
        EagleConfig(final_feature_weight=-1.0)


#: what each acceptance loss makes of alpha = sum_x min(p(x), q(x))
OF_ACCEPTANCE = {"tvd": lambda alpha: 1 - alpha, "lk": lambda alpha: -alpha.log()}


@pytest.mark.parametrize("token_loss", ["tvd", "lk"])
def test_acceptance_token_losses_score_alpha_and_train(token_loss, testbed_tiny, chat, tmp_path):
    """`eagle.token_loss: tvd` scores each drafted position by 1 - alpha, `lk` by -log alpha
    (LK^alpha), alpha = sum_x min(p(x), q(x)) over the tokens the drafter can propose, p the
    target's whole distribution (checked here through `d2t`, independently of the loss's `t2d`
    columns); both families train with either."""
    of_alpha = OF_ACCEPTANCE[token_loss]
    from draftzoo.architectures.eagle import EagleConfig, build_eagle
    from draftzoo.train.eagle_losses import eagle1_loss_sums, eagle3_loss_sums

    target = load_target(tiny_eagle_recipe(tmp_path, testbed_tiny[0], chat).target, "cpu")
    vocab, steps, s = target.lm_head.weight.shape[0], 3, 12
    drafter = build_eagle(
        EagleConfig(layers=(0, 1, 2), ttt_steps=steps, draft_vocab_size=64), target
    )
    torch.manual_seed(0)
    kept = torch.randperm(vocab)[:64].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[kept] = True
    drafter.set_vocab_map(kept - torch.arange(64), t2d)
    select = [torch.arange(s)[None] + 2 + j < s for j in range(steps)]
    target_logits = torch.randn(1, s, vocab) * 3
    outputs = [torch.randn(int(keep.sum()), 64) for keep in select]  # the draft logits
    same = torch.nn.Identity()  # outputs and "final states" are logits already
    loss, stats = eagle3_loss_sums(
        outputs,
        select,
        target_logits,
        same,
        same,
        drafter.d2t,
        drafter.t2d,
        0.8,
        token_loss=token_loss,
    )
    expected = 0.0
    for j, logits in enumerate(outputs):
        p = torch.softmax(target_logits[0, 1 + j : 1 + j + len(logits)], dim=-1)
        q = torch.softmax(logits, dim=-1)
        target_ids = torch.arange(64) + drafter.d2t  # draft id -> target id
        accepted = torch.minimum(p[:, target_ids], q).sum(-1)
        expected = expected + 0.8**j * of_alpha(accepted).sum()
    torch.testing.assert_close(loss, expected)
    assert [int(stats[f"acc_{j}"][1]) for j in range(steps)] == [int(k.sum()) for k in select]

    final = torch.randn(1, s, target.hidden_size)
    keep = select[0]
    hidden = torch.randn(int(keep.sum()), target.hidden_size)
    draft_head = torch.nn.Linear(target.hidden_size, vocab)
    teacher_head = torch.nn.Linear(target.hidden_size, vocab)
    heads = (draft_head, teacher_head)
    with_ce, _ = eagle1_loss_sums([hidden], keep, final, *heads)
    with_tvd, _ = eagle1_loss_sums([hidden], keep, final, *heads, token_loss)
    with torch.no_grad():
        logits = draft_head(hidden)
        p = torch.softmax(teacher_head(final[0, 1 : 1 + len(hidden)]), dim=-1)
    q = torch.softmax(logits, dim=-1)
    ce = -(p * q.log()).sum()
    tvd = of_alpha(torch.minimum(p, q).sum(-1)).sum()
    torch.testing.assert_close(with_ce - with_tvd, 0.1 * (ce - tvd))

    for kind in ("eagle3", "eagle1"):
        eagle = {"kind": kind, "token_loss": token_loss}
        train = {"max_steps": 6, "log_every": 2, "checkpoint_every": 50}
        recipe = tiny_eagle_recipe(tmp_path / kind, testbed_tiny[0], chat, eagle=eagle, train=train)
        result = run(recipe)
        untrained = _untrained_final_loss(tmp_path / f"{kind}-0", testbed_tiny[0], chat, 6, eagle)
        assert 0 < result.final_loss < untrained
        record = read_drafter_record(Path(recipe.output_dir))
        assert record["recipe"]["eagle"]["token_loss"] == token_loss
    with pytest.raises(ValueError, match="token_loss must be one of"):
        EagleConfig(token_loss="kl")


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_first_step_accuracy_splits_into_repeated_and_fresh_tokens(
    testbed_tiny, chat, tmp_path, kind
):
    """The training stats split step 0's top-1 hits between drafted tokens that repeat an
    earlier bigram of their packed sample and fresh ones: the two add up to `acc_0`, and the
    repeated positions are the ones counted by hand."""
    from draftzoo.architectures.eagle import build_eagle
    from draftzoo.data.batching import collate
    from draftzoo.data.capture import OnlineFeatures
    from draftzoo.train.eagle_batch import eagle_loss_sums
    from draftzoo.train.eagle_losses import real_positions

    recipe = tiny_eagle_recipe(tmp_path, testbed_tiny[0], chat, eagle={"kind": kind})
    target = load_target(recipe.target, "cpu")
    drafter = build_eagle(recipe.eagle, target)
    torch.manual_seed(0)
    rows = []
    for index, lengths in enumerate(([20, 12], [30])):
        ids = torch.randint(10, 16, (sum(lengths),)).tolist()  # 6 tokens: many repeats
        mask = [0, 0] + [1] * (sum(lengths) - 2)
        rows.append({"input_ids": ids, "loss_mask": mask, "lengths": lengths, "index": index})
    batch = collate(rows, pad_token_id=0)
    states = OnlineFeatures(target, recipe.capture_layers(target.num_layers), "float32")(batch)
    with torch.no_grad():
        _, stats = eagle_loss_sums(recipe.eagle, drafter, drafter, target, states, batch)
    repeated, fresh, overall = stats["acc_0_repeated"], stats["acc_0_fresh"], stats["acc_0"]
    torch.testing.assert_close(repeated + fresh, overall.float())
    keep = real_positions(batch, 2)
    by_hand = 0
    for b, row in enumerate(rows):
        start = 0
        for length in row["lengths"]:
            ids = row["input_ids"][start : start + length]
            for t in range(length - 2):
                pair = (ids[t + 1], ids[t + 2])
                seen = any((ids[j - 1], ids[j]) == pair for j in range(1, t + 2))
                by_hand += int(seen and bool(keep[b, start + t]))
            start += length
    assert int(repeated[1]) == by_hand and 0 < by_hand < int(overall[1])
    with torch.no_grad():  # steps that log nothing skip the split
        _, unlogged = eagle_loss_sums(recipe.eagle, drafter, drafter, target, states, batch, False)
    assert "acc_0_repeated" not in unlogged and "acc_0_fresh" not in unlogged
    torch.testing.assert_close(unlogged["acc_0"], overall)


def test_eagle3_from_fp8_shards_trains_like_online_fp8_and_resumes_exactly(
    testbed_tiny, chat, tmp_path
):
    """FP8 capture: training from `draftzoo capture`'s FP8 shards gives the online FP8 run's
    loss (both round the states the same way), and a rerun resumes to the same weights."""
    from draftzoo.cli import main

    fp8 = {"dtype": "float8_e4m3"}
    train = {"max_steps": 2}
    online = tiny_eagle_recipe(tmp_path / "on", testbed_tiny[0], chat, capture=fp8, train=train)
    first = run(online).final_loss
    shards = tmp_path / "shards"
    assert (
        main(["capture", str(recipe_yaml(online, tmp_path / "r.yaml")), "--dir", str(shards)]) == 0
    )
    assert json.loads((shards / "index.json").read_text())["dtype"] == "float8_e4m3"
    capture = replace(online.capture, mode="offline", dir=str(shards))
    offline = replace(online, output_dir=str(tmp_path / "off" / "drafter"), capture=capture)
    assert abs(first - run(offline).final_loss) / first < 1e-3
    longer = replace(
        offline,
        output_dir=str(tmp_path / "long" / "drafter"),
        train=replace(offline.train, max_steps=4, checkpoint_every=2),
    )
    run(longer)
    straight = load_file(Path(longer.output_dir) / "model.safetensors")
    again = run(longer)
    assert again.resumed_from == 2 and again.steps == 4
    resumed = load_file(Path(longer.output_dir) / "model.safetensors")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


@pytest.mark.parametrize("kind", ["eagle3", "eagle1"])
def test_the_drafter_layer_can_start_from_a_target_layer(testbed_tiny, chat, tmp_path, kind):
    """`eagle.init_layer`: the drafter's MLP, norms, o_proj and the hidden state's half of
    q/k/v start as the target layer's (EAGLE-3's embedding half keeps its random start); a run
    with it trains; a layer the target lacks is refused in one line."""
    from draftzoo.architectures.eagle import EagleConfig, build_eagle, init_layer_from_target

    target = load_target(tiny_eagle_recipe(tmp_path, testbed_tiny[0], chat).target, "cpu")
    layers = (0, 1, 2) if kind == "eagle3" else None
    config = EagleConfig(kind=kind, layers=layers, ttt_steps=1 if kind == "eagle1" else 2)
    drafter = build_eagle(config, target)
    h = target.hidden_size
    random_half = drafter.midlayer.self_attn.q_proj.weight[:, :-h].clone()
    init_layer_from_target(drafter, target, -1)
    source, mine = target.decoder_layers[-1], drafter.midlayer
    assert torch.equal(mine.mlp.down_proj.weight, source.mlp.down_proj.weight)
    assert torch.equal(mine.self_attn.o_proj.weight, source.self_attn.o_proj.weight)
    assert torch.equal(mine.self_attn.k_proj.weight[:, -h:], source.self_attn.k_proj.weight)
    if kind == "eagle3":
        assert torch.equal(mine.hidden_norm.weight, source.input_layernorm.weight)
        assert torch.equal(mine.self_attn.q_proj.weight[:, :-h], random_half[:, :h])
    with pytest.raises(TargetError, match="the target has 2 layers"):
        init_layer_from_target(drafter, target, 5)
    recipe = tiny_eagle_recipe(
        tmp_path / "run",
        testbed_tiny[0],
        chat,
        eagle={"kind": kind, "init_layer": -1},
        train={"max_steps": 2, "log_every": 1, "checkpoint_every": 50},
    )
    assert run(recipe).final_loss > 0
