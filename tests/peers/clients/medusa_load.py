"""The Medusa reference code loads an export: its `MedusaModel` heads built from the export's
config (`MedusaConfig`), the export's `medusa_lm_head.safetensors` loaded into them strictly
(every tensor present, none left over), then their forward on INPUTS as `MedusaModel.forward`
runs them.

    python medusa_load.py EXPORT TARGET INPUTS OUT

INPUTS/OUT as in medusa_save.py. Prints one JSON line. Runs in the Medusa venv.
"""

import json
import sys
from importlib.metadata import version
from pathlib import Path

import medusa.model.medusa_model as reference
import torch
from medusa_save_base import Base, target_head
from safetensors.torch import load_file, save_file

export, target, inputs, out = sys.argv[1:5]
config = reference.MedusaConfig.from_pretrained(export)
# the heads never use the base model's tokenizer, which this transformers release cannot read
reference.AutoTokenizer = type(
    "NoTokenizer", (), {"from_pretrained": staticmethod(lambda *a, **k: None)}
)
model = reference.MedusaModel(
    Base(target_head(target)), config.medusa_num_heads, config.medusa_num_layers, target
)
model.medusa_head.load_state_dict(load_file(str(Path(export) / "medusa_lm_head.safetensors")))
states = load_file(inputs)["states"].float()
with torch.no_grad():
    logits = torch.stack([model.medusa_head[i](states) for i in range(config.medusa_num_heads)])
save_file({"logits": logits.contiguous()}, out)
print(
    json.dumps(
        {"peer": f"medusa-llm {version('medusa-llm')}", "base": config.base_model_name_or_path}
    )
)
