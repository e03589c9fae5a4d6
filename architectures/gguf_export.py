"""Drafters for llama.cpp: a family's engine layout converted by llama.cpp's own converter.

    draftzoo export eagle3-smollm2-135m-instruct --format gguf --llama-cpp ~/llama.cpp \
        --output-dir exports/eagle3-gguf

A family's `gguf` exporter (in its own module) writes the layout llama.cpp's
`convert_hf_to_gguf.py` reads to a scratch folder (EAGLE-3: `LlamaForCausalLMEagle3`, DFlash:
z-lab's `DFlashDraftModel`, the draft LM: its own transformers checkpoint); that converter, from
the llama.cpp source tree `--llama-cpp` names, turns it into `draft.gguf`, the way llama.cpp's
users convert peers' drafters: EAGLE-3 and DFlash with `--target-model-dir` (the target's
folder: its tokenizer, and for DFlash its token embedding), the draft LM alone (a plain Llama
sharing the target's vocabulary). Neither EAGLE-3's nor DFlash's GGUF carries the target's
embedding or head: llama.cpp takes the target's. The export's config.json records what
converted it.

Served with `llama-speculative-simple -m TARGET.gguf -md draft.gguf --spec-type draft-eagle3`
(`draft-dflash`, `draft-simple`); docs/llama-cpp.md has the commands and the measurements.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ExportError
from .export import TOKENIZER_FILES
from .gguf_settings import GGUF_TYPES

if TYPE_CHECKING:
    from .export import Export

#: the file a `gguf` export holds
GGUF_FILE = "draft.gguf"
#: the converter inside a llama.cpp source tree
CONVERTER = "convert_hf_to_gguf.py"


def converter_of(llama_cpp: str | Path | None) -> Path:
    """llama.cpp's converter in the source tree `llama_cpp`; refused in one line when absent."""
    if not llama_cpp:
        raise ExportError(
            "--format gguf runs llama.cpp's own converter: name a llama.cpp source tree "
            f"(--llama-cpp DIR, holding {CONVERTER})"
        )
    script = Path(llama_cpp) / CONVERTER
    if not script.is_file():
        raise ExportError(f"{llama_cpp}: no {CONVERTER} there (name a llama.cpp source tree)")
    return script


def convert_with_llama_cpp(
    export: Export,
    layout_format: str,
    layout: Callable[[Export], None],
    with_target: bool,
    spec_type: str,
) -> None:
    """A family's `gguf` exporter: its `layout` exporter (as for `layout_format`) writes a
    scratch folder inside the export, llama.cpp's converter turns it into `GGUF_FILE`
    (`with_target`: given the target's folder), and a config.json records how, and the
    `--spec-type` that serves it."""
    settings = export.gguf
    script = converter_of(settings.llama_cpp)
    if settings.outtype not in GGUF_TYPES:
        raise ExportError(f"--gguf-type must be one of {', '.join(GGUF_TYPES)}")
    scratch = export.folder / ".layout"
    scratch.mkdir()
    layout(replace(export, folder=scratch, fmt=layout_format, embed_tokens=False))
    for name in TOKENIZER_FILES:  # export_drafter copied the drafter's into the export
        if (export.folder / name).is_file():
            shutil.copy2(export.folder / name, scratch / name)
    command = [
        sys.executable,
        str(script),
        str(scratch),
        "--outfile",
        str(export.folder / GGUF_FILE),
        "--outtype",
        settings.outtype,
    ]
    target_dir = export.target_location() if with_target else None
    if target_dir:
        command += ["--target-model-dir", target_dir]
    drafter_config = json.loads((scratch / "config.json").read_text())
    vocabulary = drafter_config.get("draftzoo", {}).get("draft_vocabulary")
    _run_converter(command, export.source)
    shutil.rmtree(scratch)
    (export.folder / "config.json").write_text(
        json.dumps(
            {
                "draftzoo": {
                    "family": export.record["family"],
                    "hidden_state_layers_hf": export.record["hidden_state_layers"],
                    **({"draft_vocabulary": vocabulary} if vocabulary else {}),
                    "gguf": {
                        "file": GGUF_FILE,
                        "converted_from": drafter_config.get("architectures", [None])[0],
                        "converter": str(script.resolve()),
                        "outtype": settings.outtype,
                        "target_model_dir": target_dir,
                        "spec_type": spec_type,
                    },
                }
            },
            indent=1,
        )
    )


def _run_converter(command: list[str], source: Path) -> None:
    """Run llama.cpp's converter; its failure is one line (its last error line)."""
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode == 0:
        return
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    said = lines[-1].strip() if lines else f"exit status {result.returncode}"
    hint = ""
    if "sentencepiece" in said:
        hint = (
            ' (pip install "draftzoo[llama-cpp]": the converter reads Llama vocabularies with it)'
        )
    raise ExportError(f"llama.cpp's converter refused {source}: {said[:300]}{hint}")
