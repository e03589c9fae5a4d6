"""speculators writes a drafter: load an EAGLE-3 folder with its own loader, move every weight
but the embedding off draftzoo's values (seeded), save with its own `save_pretrained`.

    python speculators_save.py SOURCE OUT SEED

Prints one JSON line. Runs in the speculators venv (its own transformers).
"""

import json
import sys
from importlib.metadata import version

import torch
from speculators import SpeculatorModel

source, out, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = SpeculatorModel.from_pretrained(source, dtype=torch.float32)
generator = torch.Generator().manual_seed(seed)
with torch.no_grad():
    for name, parameter in model.named_parameters():
        if "embed_tokens" not in name:
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.mul_(1 + 0.1 * noise)
model.save_pretrained(out)
print(json.dumps({"peer": f"speculators {version('speculators')}", "class": type(model).__name__}))
