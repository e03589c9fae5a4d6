"""SpecForge as a client: warm-start its EAGLE-3 draft model from an export, run its own
training-time-test loop.

    python specforge_eagle3.py EXPORT INPUTS OUT STEPS strict|lenient [TARGET]

`strict` warm-starts with `allow_missing_embedding=False` (the folder must hold every draft
tensor); `lenient` allows a missing embedding and then loads it from TARGET with SpecForge's
`load_embedding`, as its training recipes do. The loop is SpecForge's `OnlineEagle3Model`
unchanged except its loss, which runs a Triton kernel (GPU only) and is replaced by zeros.
INPUTS/OUT as in speculators_eagle3.py. Prints one JSON line. Runs in the SpecForge venv.
"""

import sys
from importlib.metadata import version

import torch
from client_io import capture_logits, read_inputs, write_result
from specforge.algorithms.eagle3.model import OnlineEagle3Model
from specforge.modeling.auto import AutoDraftModel
from specforge.training.model_loading import warm_start_draft_model
from transformers import AutoConfig

export, inputs, out, steps, mode = sys.argv[1:6]
steps = int(steps)
config = AutoConfig.from_pretrained(export)
model = AutoDraftModel.from_config(config, attention_backend="sdpa", torch_dtype=torch.float32)
report = warm_start_draft_model(
    model, export, draft_config=config, strategy="ddp", allow_missing_embedding=mode != "strict"
)
if mode != "strict":
    model.load_embedding(sys.argv[6])
model.eval()
x = read_inputs(inputs)
logits = capture_logits(model.lm_head)
trainer = OnlineEagle3Model(model, length=steps, attention_backend="sdpa")
zero = torch.zeros(())
trainer._acc_and_loss = lambda **kwargs: (zero,) * 7
s = x["ids"].shape[1]
with torch.no_grad():
    trainer(
        input_ids=x["ids"],
        attention_mask=torch.ones_like(x["ids"]),
        target=torch.zeros(1, s, config.vocab_size),
        loss_mask=torch.ones(1, s, 1),
        hidden_states=x["states"],
        position_ids=x["positions"],
    )
info = {
    "peer": f"specforge {version('specforge')}",
    "class": type(model).__name__,
    "loaded_keys": report.loaded_keys,
    "missing_keys": list(report.missing_keys),
}
write_result(out, logits, model.embed_tokens.weight, info)
