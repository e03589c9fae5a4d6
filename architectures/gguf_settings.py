"""How `draftzoo export --format gguf` converts: the settings an `Export` carries and the CLI
offers (architectures/gguf_export.py runs the converter)."""

from __future__ import annotations

from dataclasses import dataclass

#: what llama.cpp's converter writes floats as (its `--outtype`); "auto" keeps the layout's
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0", "auto")


@dataclass(frozen=True)
class GgufSettings:
    """How a `gguf` export is converted."""

    llama_cpp: str | None = None  # the llama.cpp source tree whose converter runs
    outtype: str = "bf16"  # what it writes floats as (its --outtype): the drafter's own dtype
