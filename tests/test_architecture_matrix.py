"""The architecture matrix (`tests/architecture_matrix.py`): every family on every tiny
architecture exact with its exports written, or refused in one line at `train --check`; and
docs/architectures.md showing exactly these cells."""

from __future__ import annotations

import pytest

from tests.architecture_matrix import DOCS, FAMILIES, docs_block, render, run_cell
from tests.tiny_architectures import ARCHITECTURES, save_tiny_target

CELLS: dict = {}


@pytest.fixture(scope="module")
def matrix_inputs(testbed_tiny, tmp_path_factory):
    """(targets folder, chat rows): the tiny targets are saved on first use."""
    from tests.train.helpers import write_chat_jsonl

    root = tmp_path_factory.mktemp("matrix")
    return root, write_chat_jsonl(root / "chat.jsonl", 24)


def _target(root, arch, testbed):
    from transformers import AutoTokenizer

    folder = root / f"target-{arch}"
    if not (folder / "config.json").exists():
        save_tiny_target(arch, folder, AutoTokenizer.from_pretrained(testbed))
    return folder


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_a_cell_is_exact_or_refused_in_one_line(arch, family, matrix_inputs, testbed_tiny):
    root, data = matrix_inputs
    target = _target(root, arch, testbed_tiny[0])
    cell = run_cell(arch, family, target, data, root / arch / family)
    CELLS[(arch, family)] = cell
    if cell.refused is not None:
        assert cell.refused and "\n" not in cell.refused
        return
    assert cell.exact, cell.identity
    assert all(why is None or "\n" not in why for why in cell.exports.values())


def test_the_docs_show_this_matrix():
    if len(CELLS) < len(ARCHITECTURES) * len(FAMILIES):
        pytest.skip("only part of the matrix ran")
    assert docs_block(DOCS.read_text()) == render(CELLS), (
        "docs/architectures.md is not what the cells found: python -m tests.architecture_matrix"
    )
