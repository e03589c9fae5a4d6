"""speculators as a client: load an EAGLE-3 export with its own loader, run its own forward.

    python speculators_eagle3.py EXPORT INPUTS OUT STEPS

INPUTS (safetensors): `ids` [1, s] (the token after each position), `states` [1, s, 3h],
`positions` [1, s]. OUT gets the draft logits of every training-time-test step [steps, 1, s, V]
(captured from `lm_head`), the draft tokens the forward returns, and the embedding the loaded
model holds. Prints one JSON line. Runs in the speculators venv (its own transformers).
"""

import sys
from importlib.metadata import version

import torch
from client_io import capture_logits, read_inputs, write_result
from speculators import SpeculatorModel

export, inputs, out, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
model = SpeculatorModel.from_pretrained(export, dtype=torch.float32).eval()
x = read_inputs(inputs)
logits = capture_logits(model.lm_head)
with torch.no_grad():
    tokens = model(
        hidden_states=x["states"],
        input_ids=x["ids"],
        document_ids=torch.zeros_like(x["ids"]),
        position_ids=x["positions"],
        ttt_steps=steps,
    )
info = {
    "peer": f"speculators {version('speculators')}",
    "class": type(model).__name__,
    "verifier": model.config.speculators_config.verifier.name_or_path,
    "layer_ids": list(model.config.eagle_aux_hidden_state_layer_ids),
}
write_result(out, logits, model.embed_tokens.weight, info, tokens=torch.stack(tokens))
