"""What keeping the target's whole-vocabulary reads at capture costs there and saves per pass.

SmolLM2-135M-Instruct's shapes (hidden 576, vocabulary 49,152, random weights), the SmolLM2
EAGLE-3 recipe (draft vocabulary 8,192), `--rows` packed rows of `--length` tokens. In one
process, alternating:
- capture: the target's forward by sample over those rows (all 30 layers) with and without the
  reads (`capture.teacher_reads`: argmax and log-normaliser over the whole vocabulary from
  the final state as stored, FP8 here, as the ShareGPT capture stores it);
- training: one EAGLE-3 loss forward and backward (the recipe's precision) from the states
  alone, where the loss projects the whole head for the argmax, and from the states with the
  reads, where it projects the draft vocabulary's rows only.
Medians; the passes over the data after which the reads have paid for themselves.

    python bench/stored_reads_bench.py                  # 4 rows of 1,024, 3 repeats
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

import torch
from eagle3_step_profile import _setup
from loss_memory import CONFIG
from teacher_reads_bench import step_seconds


def _target(layers: int | None = None):
    """SmolLM2-135M-Instruct's shapes with random weights (`layers`: fewer decoder layers)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftzoo.architectures.target import TargetAdapter

    config = LlamaConfig.from_json_file(str(CONFIG))
    if layers is not None:
        config.num_hidden_layers = layers
    torch.manual_seed(0)
    return TargetAdapter(LlamaForCausalLM(config).eval()).requires_grad_(False)


def _capture_seconds(target, batch, reads: bool) -> float:
    """One shard's work for `batch`: the forward by sample, FP8 rounding, and the reads."""
    from draftzoo.data.feature_storage import FeatureStorage
    from draftzoo.data.sample_forward import states_by_sample
    from draftzoo.data.target_head import whole_vocab_reads

    storage = FeatureStorage("float8_e4m3")
    layers = [2, 15, 27, 28, target.num_layers]
    began = time.perf_counter()
    states = states_by_sample(target, batch, layers)
    for b, lengths in enumerate(batch.lengths):
        length = sum(lengths)
        for layer in layers:
            encoded = storage.encode(states[layer][b, :length])
            if reads and layer == target.num_layers:
                whole_vocab_reads(target, storage.decode(**encoded))
    return time.perf_counter() - began


def main() -> None:
    from draftzoo.data.target_head import TEACHER_ARGMAX, TEACHER_LOG_NORM, whole_vocab_reads
    from draftzoo.train.precision import native_bf16

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bf16 = native_bf16(torch.device("cpu"))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()
    loss, model, batch, states = _setup(args.rows, args.length)
    final = states[loss.target.num_layers]
    reads = whole_vocab_reads(loss.target, final.flatten(0, 1))
    with_reads = {
        **states,
        TEACHER_ARGMAX: reads[TEACHER_ARGMAX].long().view(final.shape[:2]),
        TEACHER_LOG_NORM: reads[TEACHER_LOG_NORM].view(final.shape[:2]),
    }
    whole = _target()
    times: dict[str, list[float]] = {}
    for repeat in range(args.repeats + 1):  # the first of each is a warm-up
        for name, seconds in (
            ("capture", lambda: _capture_seconds(whole, batch, False)),
            ("capture + reads", lambda: _capture_seconds(whole, batch, True)),
            ("step", lambda: step_seconds(loss, model, batch, states, autocast)),
            ("step from reads", lambda: step_seconds(loss, model, batch, with_reads, autocast)),
        ):
            took = seconds()
            if repeat:
                times.setdefault(name, []).append(took)
    median = {name: statistics.median(values) for name, values in times.items()}
    tokens = args.rows * args.length
    for name, seconds in median.items():
        print(f"{name:16} {seconds:7.2f} s  {tokens / seconds:7.0f} tokens/s")
    cost = median["capture + reads"] - median["capture"]
    saved = median["step"] - median["step from reads"]
    precision = "bfloat16 autocast" if bf16 else "float32"
    print(
        f"the reads cost {cost:.2f} s at capture and save {saved:.2f} s a pass "
        f"(paid back after {cost / saved:.2f} passes); {args.rows} x {args.length} tokens, "
        f"{args.threads} threads, {precision}, medians of {args.repeats}"
    )


if __name__ == "__main__":
    main()
