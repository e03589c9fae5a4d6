"""Medusa-1 heads for testbed-small trained by the Medusa reference's own training code.

The reference (`medusa-llm` 0.1, tests/peers' "medusa" venv) trains with its `MedusaModel`
(heads started from the target's head, the frozen base run under inference mode) and its
`CustomizedTrainer` (transformers' Trainer; the loss: cross-entropy of head k against the data's
token k + 2 places ahead, summed over heads) and saves `config.json` and `medusa_lm_head.pt` as
its `train.py` does. Only its data step is not used: `preprocess` renders Vicuna's template with
fastchat and a Llama tokenizer's offsets; here the rows are draftzoo's own tokenization of the
same data as recipes/medusa1/testbed-small.yaml (testbed-chat, the target's chat template,
assistant tokens supervised), one conversation per row padded to 256 (the reference does not
pack). Two steps, two interpreters:

    python bench/medusa_reference.py rows runs/medusa-reference/rows.jsonl --rows 6400
    .peers/medusa/bin/python bench/medusa_reference.py train runs/medusa-reference/rows.jsonl \\
        runs/medusa-reference/heads --steps 1600

then `draftzoo import runs/medusa-reference/heads --output-dir ... --target testbed-small
--allow-pickle`, `draftzoo eval` and `draftzoo publish` as for any drafter.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "recipes/testbed/testbed-small"
IGNORE = -100  # the reference's IGNORE_TOKEN_ID (transformers' LabelSmoother.ignore_index)


def write_rows(out: Path, count: int, length: int) -> None:
    """draftzoo's tokenization of testbed-chat for testbed-small: ids and supervised mask."""
    from dataclasses import replace

    from draftzoo.architectures.safe_load import load_tokenizer
    from draftzoo.data.token_dataset import build_token_dataset
    from draftzoo.train.registry import load_recipe
    from draftzoo.train.setup import target_path

    recipe = load_recipe(ROOT / "recipes/medusa1/testbed-small.yaml")
    data = replace(recipe.data, packing=False, max_length=length, heldout_rows=0)
    tokenizer = load_tokenizer(target_path(recipe.target))
    dataset, report, _ = build_token_dataset(data, tokenizer, out.parent / "cache")
    print(report.summary())
    rows = dataset.select(range(min(count, len(dataset))))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with tmp.open("w") as handle:
        for row in rows:
            handle.write(json.dumps({"input_ids": row["input_ids"], "mask": row["loss_mask"]}))
            handle.write("\n")
    os.replace(tmp, out)
    tokens = sum(sum(r["loss_mask"]) for r in rows)
    print(f"{len(rows)} rows, {tokens} supervised tokens -> {out}")


def _reference_trainer():
    """The reference's training module; fastchat (only its data step uses it) is absent."""
    for name in ("fastchat", "fastchat.conversation", "fastchat.model.model_adapter"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["fastchat.conversation"].SeparatorStyle = None
    sys.modules["fastchat.model"] = types.ModuleType("fastchat.model")
    sys.modules["fastchat.model.model_adapter"].get_conversation_template = None
    import transformers.utils.import_utils as available

    # the shared site's `datasets` needs a newer huggingface_hub than this transformers; the
    # Trainer here reads a list of rows and never uses it
    available._datasets_available = False
    import medusa.model.medusa_model as model_module
    import medusa.train.train as train_module

    # MedusaModel loads the base model's tokenizer, which this transformers cannot read; the
    # heads never use it
    model_module.AutoTokenizer = type(
        "NoTokenizer", (), {"from_pretrained": staticmethod(lambda *a, **k: None)}
    )
    return model_module, train_module


def train(rows_path: Path, folder: Path, steps: int, heads: int, seed: int) -> None:
    import torch
    import transformers

    model_module, train_module = _reference_trainer()

    class Trainer(train_module.CustomizedTrainer):
        # transformers >= 4.46 passes num_items_in_batch; the reference's loss predates it
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs)

    transformers.set_seed(seed)
    base = transformers.LlamaForCausalLM.from_pretrained(str(TARGET), torch_dtype=torch.float32)
    for parameter in base.base_model.parameters():  # as train.py: the base model frozen
        parameter.requires_grad = False
    model = model_module.MedusaModel(base, heads, 1, str(TARGET))
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    pad = base.config.pad_token_id or 0
    dataset = [_padded(row, 256, pad) for row in rows]
    args = transformers.TrainingArguments(
        output_dir=str(folder / "trainer"),
        per_device_train_batch_size=4,
        max_steps=steps,
        learning_rate=1e-3,  # the reference's README: lr 1e-3, warm-up 0.1, cosine, no decay
        warmup_ratio=0.1,
        lr_scheduler_type="cosine",
        weight_decay=0.0,
        logging_steps=100,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=seed,
        remove_unused_columns=False,
    )
    Trainer(model=model, args=args, train_dataset=dataset).train()
    # what train.py writes: the Medusa config and the heads' state dict
    config = model_module.MedusaConfig(
        medusa_num_heads=heads, medusa_num_layers=1, base_model_name_or_path=str(TARGET)
    )
    config.save_pretrained(str(folder))
    torch.save(model.medusa_head.state_dict(), folder / "medusa_lm_head.pt")
    print(json.dumps({"written": sorted(os.listdir(folder)), "steps": steps, "rows": len(rows)}))


def _padded(row: dict, length: int, pad: int) -> dict:
    import torch

    ids = row["input_ids"][:length]
    labels = [t if m else IGNORE for t, m in zip(ids, row["mask"][:length], strict=True)]
    fill = length - len(ids)
    return {
        "input_ids": torch.tensor(ids + [pad] * fill),
        "labels": torch.tensor(labels + [IGNORE] * fill),
        "attention_mask": torch.tensor([1] * len(ids) + [0] * fill),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    rows = sub.add_parser("rows", help="draftzoo's rows (draftzoo's interpreter)")
    rows.add_argument("out", type=Path)
    rows.add_argument("--rows", type=int, default=6400)
    trained = sub.add_parser("train", help="the reference's training (the medusa venv)")
    trained.add_argument("rows", type=Path)
    trained.add_argument("folder", type=Path)
    trained.add_argument("--steps", type=int, default=1600)
    trained.add_argument("--heads", type=int, default=4)
    trained.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.step == "rows":
        write_rows(args.out, args.rows, 256)
    else:
        train(args.rows, args.folder, args.steps, args.heads, args.seed)


if __name__ == "__main__":
    main()
