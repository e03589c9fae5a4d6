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

    def __post_init__(self) -> None:
        if self.max_length < 1:
            raise GenerationError(f"the cache length must be >= 1, got {self.max_length}")
        if self.cuda_graphs and not self.static:
            raise GenerationError("CUDA graphs replay forwards on static caches: set static too")


#: the default: caches that grow with the context
GROWING = CacheSettings()
