import pytest

from draftzoo.data.chat_pairs import iter_function_pairs
from draftzoo.data.corpus import CorpusError, CorpusSpec, list_sources
from draftzoo.data.prompts import (
    PromptSetError,
    humaneval_prompts,
    load_prompt_set,
    stdlib_heldout_prompts,
)

SOURCE = '''
import os

def documented(a, b=2):
    """Add two numbers.

    Returns their sum.
    """
    total = a + b
    return total

class Box:
    def method(self):
        """Return one."""
        x = 1
        return x

def undocumented():
    return 3
'''


def test_function_pairs_cut_at_the_docstring():
    pairs = {p.name: p for p in iter_function_pairs(SOURCE, min_body_lines=2)}
    assert set(pairs) == {"documented", "method"}
    doc = pairs["documented"]
    assert (
        doc.prompt
        == 'def documented(a, b=2):\n    """Add two numbers.\n\n    Returns their sum.\n    """\n'
    )
    assert doc.solution.startswith(doc.prompt)
    assert doc.solution.endswith("    return total\n")
    assert pairs["method"].solution.startswith("def method(self):")  # dedented
    assert doc.as_messages()[1] == {"role": "assistant", "content": doc.solution}


def test_unparseable_source_yields_nothing():
    assert list(iter_function_pairs("def broken(:\n")) == []


def test_stdlib_listing_is_deterministic_and_split_by_module():
    spec = CorpusSpec(packages=(), max_files=400)
    first, second = list_sources(spec), list_sources(spec)
    assert first == second
    assert [f.path for f in first] == sorted(f.path for f in first)
    splits = {f.split for f in first}
    assert splits == {"train", "heldout"}
    by_group: dict[str, set[str]] = {}
    for f in first:
        by_group.setdefault(".".join(f.module.split(".")[:2]), set()).add(f.split)
    assert all(len(s) == 1 for s in by_group.values())  # a module group never straddles


def test_full_corpus_is_tens_of_millions_of_tokens_worth_of_text():
    from draftzoo.train.testbed import load_testbed_config

    spec = load_testbed_config("small").corpus.spec()
    files = list_sources(spec)
    total = sum(f.path.stat().st_size for f in files)
    assert total > 100e6  # ~3.5 bytes per token: well over 25M tokens
    assert {f.origin for f in files} == set(spec.origins)


def test_missing_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(CorpusError, match="no Python standard library at"):
        list_sources(CorpusSpec(packages=(), stdlib_dir=tmp_path))
    with pytest.raises(CorpusError, match="corpus package 'no-such-dist' is not installed"):
        list_sources(CorpusSpec(packages=("no-such-dist",), include_stdlib=False))


def test_prompt_sets():
    humaneval = humaneval_prompts()
    assert len(humaneval) == 164
    assert humaneval[0].prompt_id == "HumanEval/0"
    assert "def has_close_elements" in humaneval[0].text
    heldout = stdlib_heldout_prompts(limit=20)
    assert len(heldout) == 20
    held_modules = {f.module for f in list_sources(CorpusSpec(packages=())) if f.split == "heldout"}
    assert all(p.prompt_id.split(":")[0] in held_modules for p in heldout)
    with pytest.raises(PromptSetError, match="known: humaneval, mt-bench, sharegpt-heldout"):
        load_prompt_set("no-such-set")
