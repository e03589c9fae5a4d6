"""How the KV caches of the target and the drafter are kept: one setting object for every
generator and proposer, instead of loose flags.

    from draftzoo.inference.cache_settings import CacheSettings
    SpeculativeGenerator(target, tokenizer, proposer, 4, cache=CacheSettings(static=True))
    draftzoo.load("eagle3-testbed-small", cache=CacheSettings(static=True, max_length=4096))

Growing caches (the default) follow the context; static caches are buffers allocated once for
`max_length` positions (prompt and new tokens together), whose decode-sized forwards replay as
CUDA graphs on CUDA (`static_forward.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..architectures.defaults import MAX_CACHE_LENGTH
from .errors import GenerationError


@dataclass(frozen=True)
class CacheSettings:
    """Where the KV caches live and whether their forwards replay as CUDA graphs."""

    static: bool = False  # buffers allocated once instead of caches that grow
    max_length: int = MAX_CACHE_LENGTH  # static: positions held, prompt and new tokens together
    cuda_graphs: bool | None = None  # static: replay forwards as graphs; None = on CUDA only
    #: the target's verification forwards on packed weights and in-place grouped-query
    #: attention (`cpu_kernels.py`; one more copy of the weights per width used); None = on a
    #: float32 CPU target where torch has MKL, True = required there
    cpu_kernels: bool | None = None

    def __post_init__(self) -> None:
        if self.max_length < 1:
            raise GenerationError(f"the cache length must be >= 1, got {self.max_length}")
        if self.cuda_graphs and not self.static:
            raise GenerationError("CUDA graphs replay forwards on static caches: set static too")

    def kernels_note(self, target) -> str:
        """Which kernels the target's verification forwards run on, as a report says it."""
        from .cpu_kernels import NOTE, unavailable_reason

        if self.cpu_kernels is False:
            return "stock (asked)"
        reason = unavailable_reason(target)
        return NOTE if reason is None else f"stock ({reason})"

    def kernels_for(self, target):
        """The `CpuKernels` the target's verification forwards run on (one per target, shared
        by its generators), or None."""
        from .cpu_kernels import shared_kernels, unavailable_reason

        if self.cpu_kernels is False:
            return None
        reason = unavailable_reason(target)
        if reason is None:
            return shared_kernels(target)
        if self.cpu_kernels:
            raise GenerationError(f"the CPU verification kernels were asked for, but {reason}")
        return None


#: the default: caches that grow with the context
GROWING = CacheSettings()
