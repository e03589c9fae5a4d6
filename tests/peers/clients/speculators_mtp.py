"""speculators writes an MTP drafter: its `MTPDraftModel` for a Qwen3 verifier, built as its
`from_training_args` builds one (the verifier's config as the layer's, a greedy proposal of
STEPS tokens, the verifier's embedding and head loaded by `load_verifier_weights`), its
module's weights drawn (seeded), saved with its own `save_pretrained`; then loaded back with
its `from_pretrained` and run forward (teacher-forced, every step on the module's own output).

    python speculators_mtp.py VERIFIER FOLDER INPUTS OUT SEED STEPS

INPUTS (safetensors): `ids` [1, s], `states` [1, s, h] (the verifier's final states). OUT gets
its logits per step [STEPS, 1, s - STEPS - 1, V]. Prints one JSON line. Runs in the
speculators venv.
"""

import sys
from importlib.metadata import version

import torch
from client_io import write_result
from safetensors.torch import load_file
from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.models.mtp import MTPDraftModel, MTPSpeculatorConfig
from speculators.proposals.greedy import GreedyTokenProposalConfig
from transformers import AutoConfig

verifier, folder, inputs, out, seed, steps = sys.argv[1:7]
steps = int(steps)
config = MTPSpeculatorConfig(
    transformer_layer_config=AutoConfig.from_pretrained(verifier),
    speculators_config=SpeculatorsConfig(
        algorithm="mtp",
        proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=steps)],
        default_proposal_method="greedy",
        verifier=VerifierConfig.from_pretrained(verifier),
    ),
)
model = MTPDraftModel(config)
model.load_verifier_weights()
generator = torch.Generator().manual_seed(int(seed))
with torch.no_grad():
    for name, parameter in model.mtp_layers.named_parameters():
        noise = torch.randn(parameter.shape, generator=generator)
        parameter.copy_(1.0 + 0.1 * noise if "norm" in name else 0.08 * noise)
model.save_pretrained(folder)
loaded = MTPDraftModel.from_pretrained(folder, dtype=torch.float32).eval()
x = load_file(inputs)
with torch.no_grad():
    logits, _, _ = loaded(input_ids=x["ids"], hidden_states=x["states"].float())
info = {
    "peer": f"speculators {version('speculators')}",
    "class": type(loaded).__name__,
    "keys": sorted(loaded.state_dict()),
}
write_result(out, [step.float() for step in logits], loaded.embed_tokens.weight, info)
