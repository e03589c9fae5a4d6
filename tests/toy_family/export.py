"""The bigram drafter's one export: its two matrices as a numpy archive."""

from __future__ import annotations

import json

import numpy as np


def export_npz(export) -> None:
    tensors = export.tensors()
    arrays = {name: tensor.float().numpy() for name, tensor in tensors.items()}
    np.savez(export.folder / "bigram.npz", **arrays)
    mark = {"draftzoo": {"family": export.record["family"]}}  # the export is draftzoo's
    (export.folder / "config.json").write_text(json.dumps(mark))
