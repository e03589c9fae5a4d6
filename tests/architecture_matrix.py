"""The architecture matrix: every family on a tiny target of every architecture users bring.

A cell is one family on one architecture (`tests/tiny_architectures.py`): `train --check` as a
user runs it (a refusal there is one line and ends the cell), two training steps, then the
trained drafter decoding greedily on chains and (where the family drafts them) trees, on the
growing and the static cache, one prompt at a time and four in a batch, each equal to the
target's own greedy output; then every export the family has except GGUF (llama.cpp's
converter needs a tokenizer it knows: checked on SmolLM2 in tests/peers/test_llama_cpp.py).

    python -m tests.architecture_matrix        # run every cell, rewrite docs/architectures.md

`tests/test_architecture_matrix.py` runs the same cells and checks that the docs show them.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tests.tiny_architectures import ARCHITECTURES, save_tiny_target

FAMILIES = ("draft_lm", "eagle1", "eagle3", "medusa1", "medusa2", "mtp", "dflash")
#: the formats a cell does not export, and why
SKIPPED_FORMATS = {"gguf"}
PROMPTS = ['def add(a, b):\n    """Return a + b."""\n', "import os\n", "for i in range(10):\n", "x"]
NEW_TOKENS = 24
DRAFT_TOKENS = 3
DOCS = Path(__file__).parents[1] / "docs" / "architectures.md"
BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"


@dataclass
class Cell:
    """What one family did on one architecture."""

    arch: str
    family: str
    refused: str | None = None  # `train --check`'s one line, when it refused
    identity: dict[str, tuple[int, int]] = field(default_factory=dict)  # equal / prompts
    accepted: int = 0  # draft tokens accepted over every decode
    exports: dict[str, str | None] = field(default_factory=dict)  # format: None or refusal

    @property
    def exact(self) -> bool:
        """Every decode equal to the target's own greedy output."""
        return all(equal == total for equal, total in self.identity.values())


def tiny_recipe(family: str, work: Path, target: Path, data: Path):
    """The family's tiny test recipe (tests/train/helpers.py) for `target`, drafting at most
    `DRAFT_TOKENS` tokens a round."""
    from tests.train import helpers

    if family in ("eagle1", "eagle3"):
        eagle = {"kind": family, "ttt_steps": 3 if family == "eagle3" else 1}
        if family == "eagle3":
            eagle["layers"] = [1, 2, 3]  # taps every engine can capture on 4 layers
        return helpers.tiny_eagle_recipe(work, target, data, eagle=eagle)
    makers = {
        "draft_lm": helpers.tiny_recipe,
        "medusa1": helpers.tiny_medusa_recipe,
        "medusa2": helpers.tiny_medusa2_recipe,
        "mtp": helpers.tiny_mtp_recipe,
        "dflash": helpers.tiny_dflash_recipe,
    }
    return makers[family](work, target, data)


def check_line(recipe_path: Path) -> str | None:
    """`draftzoo train RECIPE --check`: None when it passes, else its one error line."""
    from draftzoo.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["train", str(recipe_path), "--check"])
    lines = [line for line in err.getvalue().splitlines() if line.startswith("draftzoo: error:")]
    if code == 0:
        return None
    if code != 2 or len(lines) != 1:
        raise AssertionError(f"train --check exited {code} with {err.getvalue()!r}")
    return lines[0].removeprefix("draftzoo: error: ")


def run_cell(arch: str, family: str, target: Path, data: Path, work: Path) -> Cell:
    """Check, train, decode and export one cell (see the module docstring)."""
    from transformers import AutoModelForCausalLM

    import draftzoo
    from draftzoo.architectures.errors import DraftzooError
    from draftzoo.architectures.export import export_drafter
    from draftzoo.architectures.families import family_spec
    from draftzoo.inference.batch import BatchGenerator
    from draftzoo.inference.cache_settings import CacheSettings
    from draftzoo.inference.generate import SpeculativeGenerator
    from draftzoo.inference.sampling import SamplingParams
    from draftzoo.train.registry import run_recipe
    from tests.train.helpers import recipe_yaml

    cell = Cell(arch, family)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    recipe = tiny_recipe(family, work, target, data)
    cell.refused = check_line(recipe_yaml(recipe, work / "recipe.yaml"))
    if cell.refused is not None:
        return cell
    run_recipe(recipe)
    folder = Path(recipe.output_dir)
    spec = family_spec(family)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    params = SamplingParams(max_new_tokens=NEW_TOKENS)
    # loaded once before the reference: a family that adapts its target (Medusa-2) merges
    # its adapter into `model`, which is then the target it is exact to
    tokenizer = _tokenizer(target)
    draftzoo.load(folder, target=model, tokenizer=tokenizer, num_speculative_tokens=DRAFT_TOKENS)
    plain = SpeculativeGenerator(model, tokenizer)
    reference = [plain.generate(prompt, params).token_ids for prompt in PROMPTS]
    kinds = ("chain", "tree") if spec.tree_class() is not None else ("chain",)
    for kind in kinds:
        for name, cache in (("growing", CacheSettings()), ("static", _static())):
            generator = draftzoo.load(
                folder,
                target=model,
                tokenizer=tokenizer,
                proposal=kind,
                num_speculative_tokens=DRAFT_TOKENS,
                cache=cache,
            )
            outs = [generator.generate(prompt, params) for prompt in PROMPTS]
            cell.identity[f"{kind}, {name}, 1 row"] = _equal(outs, reference)
            cell.accepted += sum(o.metrics.num_accepted_tokens for o in outs)
            runtime = generator.drafter
            batch = BatchGenerator(
                model,
                tokenizer,
                runtime.make_proposer,
                runtime.num_speculative_tokens or DRAFT_TOKENS,
                cache=cache,
            )
            outs = batch.generate(PROMPTS, params).outputs
            cell.identity[f"{kind}, {name}, 4 rows"] = _equal(outs, reference)
    for fmt in spec.export_formats:
        if fmt in SKIPPED_FORMATS:
            continue
        try:
            export_drafter(folder, work / f"export-{fmt}", fmt, target_config=model.config)
            cell.exports[fmt] = None
        except DraftzooError as err:
            cell.exports[fmt] = str(err).splitlines()[0]
    return cell


def _static():
    from draftzoo.inference.cache_settings import CacheSettings

    return CacheSettings(static=True, max_length=256)


def _tokenizer(target: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target)


def _equal(outs, reference) -> tuple[int, int]:
    equal = sum(out.token_ids == ref for out, ref in zip(outs, reference, strict=True))
    return equal, len(reference)


# -- the docs ----------------------------------------------------------------------------
def _mark(cell: Cell) -> str:
    if cell.refused is not None:
        return "refused"
    if not cell.exact:
        return "**not exact**"
    refused = sorted(fmt for fmt, why in cell.exports.items() if why is not None)
    return "✓" + (f" ({', '.join(refused)} refused)" if refused else "")


def render(cells: dict[tuple[str, str], Cell]) -> str:
    """The matrix and its refusals as markdown (what docs/architectures.md shows)."""
    lines = ["| architecture | " + " | ".join(FAMILIES) + " |"]
    lines.append("|---" * (len(FAMILIES) + 1) + "|")
    for arch in ARCHITECTURES:
        marks = [_mark(cells[(arch, family)]) for family in FAMILIES]
        lines.append(f"| {arch} | " + " | ".join(marks) + " |")
    groups: dict[tuple[str, str], tuple[dict, dict]] = {}  # (family, reason): stages, archs
    for (arch, family), cell in cells.items():
        refusals = [("`train --check`", cell.refused)] if cell.refused is not None else []
        refusals += [(f"`export --format {f}`", why) for f, why in sorted(cell.exports.items())]
        for stage, why in refusals:
            if why is not None:  # one line per reason: the target's name stands as <target>
                reason = why.replace(f"'{arch}'", "'<target>'")
                stages, archs = groups.setdefault((family, reason), ({}, {}))
                stages[stage], archs[arch] = None, None
    reasons = [
        f"- {family} on {', '.join(archs)}, {' and '.join(stages)}: {reason}"
        for (family, reason), (stages, archs) in groups.items()
    ]
    return "\n".join([*lines, "", "Refusals, each one line as the user sees it:", "", *reasons])


def docs_block(text: str) -> str:
    """The generated part of docs/architectures.md."""
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def write_docs(cells: dict[tuple[str, str], Cell]) -> None:
    text = DOCS.read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    DOCS.write_text(f"{head}{BEGIN}\n{render(cells)}\n{END}{tail}")


def run_all(root: Path) -> dict[tuple[str, str], Cell]:
    """Every cell, on targets built under `root` (testbed-tiny's tokenizer, chat rows)."""
    from draftzoo.train.testbed import build_testbed, load_testbed_config
    from tests.train.helpers import write_chat_jsonl

    testbed = root / "testbed-tiny"
    if not (testbed / "config.json").exists():
        build_testbed(load_testbed_config("tiny"), testbed, cache_dir=root / "cache")
    data = write_chat_jsonl(root / "chat.jsonl", 24)
    tokenizer = _tokenizer(testbed)
    cells = {}
    for arch in ARCHITECTURES:
        target = save_tiny_target(arch, root / f"target-{arch}", tokenizer)
        for family in FAMILIES:
            cells[(arch, family)] = run_cell(arch, family, target, data, root / arch / family)
            print(arch, family, _mark(cells[(arch, family)]), flush=True)
    return cells


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        write_docs(run_all(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(scratch)))
