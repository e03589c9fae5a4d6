"""The Medusa reference code writes heads: its `MedusaModel` heads over a target's head, moved
off their initial values (seeded), saved as its training script saves them
(`MedusaConfig.save_pretrained` and `torch.save(medusa_head.state_dict(), "medusa_lm_head.pt")`);
then its heads' forward (`medusa_head[i](hidden_states)`, as `MedusaModel.forward`) on INPUTS.

    python medusa_save.py TARGET HEADS LAYERS FOLDER INPUTS OUT SEED

INPUTS (safetensors): `states` [1, s, h], the target's final states. OUT gets `logits`
[HEADS, 1, s, V]. Prints one JSON line. Runs in the Medusa venv (its own transformers).
"""

import json
import os
import sys
from importlib.metadata import version

import medusa.model.medusa_model as reference
import torch
from medusa_save_base import Base, target_head
from safetensors.torch import load_file, save_file

target, heads, layers, folder, inputs, out, seed = sys.argv[1:8]
heads, layers = int(heads), int(layers)


# the heads never use the base model's tokenizer, which this transformers release cannot read
reference.AutoTokenizer = type(
    "NoTokenizer", (), {"from_pretrained": staticmethod(lambda *a, **k: None)}
)
model = reference.MedusaModel(Base(target_head(target)), heads, layers, target)
generator = torch.Generator().manual_seed(int(seed))
with torch.no_grad():
    for parameter in model.medusa_head.parameters():
        parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
config = reference.MedusaConfig(
    medusa_num_heads=heads, medusa_num_layers=layers, base_model_name_or_path=target
)
config.save_pretrained(folder)
torch.save(model.medusa_head.state_dict(), os.path.join(folder, "medusa_lm_head.pt"))
states = load_file(inputs)["states"].float()
with torch.no_grad():
    logits = torch.stack([model.medusa_head[i](states) for i in range(heads)])
save_file({"logits": logits.contiguous()}, out)
print(
    json.dumps({"peer": f"medusa-llm {version('medusa-llm')}", "files": sorted(os.listdir(folder))})
)
