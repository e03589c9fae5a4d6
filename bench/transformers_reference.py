"""transformers' own decoding as leaderboard reference rows, measured beside draftzoo's.

    from transformers_reference import assisted_rows   # bench/families.py calls it

On the eval's prompts (chat-rendered, one warm-up prompt first), per temperature, every prompt
is decoded by draftzoo's target-only runtime, by transformers' `generate` alone and by
`generate(assistant_model=draft LM)` (a chain of the eval's length, constant schedule), in one
process, the order rotating prompt by prompt, with the same seed. Speedup is tokens/s over
draftzoo's target-only; tau counts tokens per target forward (draftzoo's own count for its
rows, which leaves out the prefill; a hook on the target counts transformers' forwards, whose
first both prefills and verifies). At T = 1 transformers
samples with top-k and top-p off, so every method draws from softmax(logits).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from draftzoo.eval.leaderboard import Measured, Row, group_of, parameter_count, row_as_json
from draftzoo.eval.runner import environment, load_prompts
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.load import load_target
from draftzoo.inference.round import eos_ids
from draftzoo.inference.sampling import SamplingParams


class _ForwardCounter:
    """Counts the target's forward calls while installed."""

    def __init__(self, model) -> None:
        self.calls = 0
        self.handle = model.register_forward_hook(self._count)

    def _count(self, *args) -> None:
        self.calls += 1


def _hf(target, tokenizer, text, temperature, max_new_tokens, seed, eos, assistant=None):
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    torch.manual_seed(seed)
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    began = time.perf_counter()
    out = target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        eos_token_id=sorted(eos),
        pad_token_id=tokenizer.pad_token_id,
        assistant_model=assistant,
        **(sampling if temperature > 0 else {"do_sample": False}),
    )
    return out.shape[1] - ids.shape[1], time.perf_counter() - began


def assisted_rows(
    draft_lm: Path, config, group_report: dict | None = None, target_name: str = "testbed-small"
) -> list[dict]:
    """Reference rows (JSON): draftzoo target-only, transformers target-only, transformers
    assisted generation with `draft_lm`, all on `config`'s prompts and temperatures."""
    from draftzoo.architectures.safe_load import load_causal_lm

    target, tokenizer = load_target(target_name)
    assistant = load_causal_lm(draft_lm, dtype=target.dtype).eval()
    assistant.generation_config.num_assistant_tokens = config.num_speculative_tokens
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    plain = SpeculativeGenerator(target, tokenizer)
    eos = eos_ids(target, tokenizer)
    texts = [p.render(tokenizer, config.chat) for p in load_prompts(config)]
    counter = _ForwardCounter(target)
    names = ("draftzoo target-only", "transformers target-only", "transformers assisted")
    rows = {name: Row(name, "target_only", "-", "") for name in names[:2]}
    rows[names[2]] = Row(
        f"transformers assisted ({draft_lm.name})",
        "transformers_assisted",
        f"chain of {config.num_speculative_tokens}",
        "",
        parameters=parameter_count(draft_lm),
    )
    try:
        for temperature in config.temperatures:
            totals = {name: [0, 0.0, 0] for name in names}  # tokens, seconds, forwards
            for index, text in enumerate(texts):
                seed = config.seed + index
                order = names[index % 3 :] + names[: index % 3]
                for name in order:
                    before = counter.calls
                    if name == names[0]:
                        params = SamplingParams(
                            temperature=temperature,
                            max_new_tokens=config.max_new_tokens,
                            seed=seed,
                        )
                        began = time.perf_counter()
                        out = plain.generate(text, params)
                        seconds = time.perf_counter() - began
                        tokens = len(out.token_ids)
                        # draftzoo's tau counts verification forwards, not the prefill
                        forwards = out.metrics.num_target_forwards
                    else:
                        helper = assistant if name == names[2] else None
                        tokens, seconds = _hf(
                            target,
                            tokenizer,
                            text,
                            temperature,
                            config.max_new_tokens,
                            seed,
                            eos,
                            helper,
                        )
                        forwards = counter.calls - before
                    if index > 0:  # the first prompt warms up
                        total = totals[name]
                        total[0] += tokens
                        total[1] += seconds
                        total[2] += forwards
            baseline = totals[names[0]][0] / totals[names[0]][1]
            for name in names:
                tokens, seconds, forwards = totals[name]
                rows[name].temperatures[f"T={temperature:g}"] = Measured(
                    tau=tokens / forwards, speedup=tokens / seconds / baseline
                )
    finally:
        counter.handle.remove()
    report = group_report or {
        "hardware": environment()["hardware"],
        "config": config.record(),
        "target": {"name": target_name},
    }
    for row in rows.values():
        row.group = group_of(report)
    return [row_as_json(row) for row in rows.values()]
