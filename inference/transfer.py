"""Host-to-device copies that do not wait for the device.

`torch.tensor(values, device="cuda")` copies from pageable memory and synchronises the stream
first, so the host would wait for every queued kernel (the drafts of this round) before it
could queue the next one. From pinned memory the copy is queued like a kernel instead.
"""

from __future__ import annotations

import torch


def to_device(values, device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`values` (nested lists of numbers, or a host tensor) as a tensor on `device`; on CUDA
    copied from pinned memory without a stream synchronisation."""
    tensor = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda" or tensor.device.type == "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
