"""speculators as a client of a DFlash export: load it with its own loader, run its own
anchored-block forward (`DFlashDraftModel._backbone_forward`, the part of `forward` before the
loss) with SDPA attention.

    python speculators_dflash.py EXPORT INPUTS OUT

INPUTS (safetensors): `states` [1, s, k*h] (the target's states at the taps), `ids` [1, s],
`anchors` [n] (block anchors, increasing), `final` [1, s, h] (the target's last states, which
only its loss reads). OUT gets its draft logits at every block slot [1, n*block, V] and the
embedding it holds. Prints one JSON line. Runs in the speculators venv.
"""

import sys
from importlib.metadata import version

import torch
from client_io import write_result
from safetensors.torch import load_file
from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig

export, inputs, out = sys.argv[1:4]
config = DFlashSpeculatorConfig.from_pretrained(export)
# its default flex attention compiles a block mask (a C++ toolchain on CPU); SDPA reads the
# same mask densely
config.transformer_layer_config._attn_implementation = "sdpa"
model = DFlashDraftModel.from_pretrained(export, config=config, dtype=torch.float32).eval()
x = load_file(inputs)
s, anchors = x["ids"].shape[1], x["anchors"]
loss_mask = torch.zeros(1, s, dtype=torch.long)
loss_mask[0, anchors] = 1  # its anchors are drawn among these: exactly these, sorted
with torch.no_grad():
    _, logits, _, _, blocks = model._backbone_forward(
        x["states"].float(),
        x["ids"],
        loss_mask,
        x["final"].float(),
        torch.zeros(1, s, dtype=torch.long),
        torch.arange(s)[None],
        max_anchors=len(anchors),
    )
info = {
    "peer": f"speculators {version('speculators')}",
    "class": type(model).__name__,
    "block_starts": blocks[:: model.block_size].tolist(),
    "layer_ids": list(model.config.aux_hidden_state_layer_ids),
    "verifier": model.config.speculators_config.verifier.name_or_path,
}
write_result(out, [logits], model.embed_tokens.weight, info)
