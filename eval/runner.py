"""`draftzoo eval`: target-only and speculative decoding on the same prompts, side by side.

    draftzoo eval runs/eagle3-testbed-small --prompt-set humaneval --prompts 20 \
        --temperatures 0 1 --batch-sizes 1 4 --repeats 2 --output-dir runs/eagle3-eval

Per temperature and batch size, every prompt is decoded target-only and speculatively in the
same process, interleaved prompt by prompt (the order alternates), with the same seed; one
warm-up prompt is decoded first and not counted. Batch sizes above 1 decode chunks of that
many prompts with `BatchGenerator`, target-only and speculative, chunk by chunk. Repeats rerun
everything, so the speedup comes with its spread. The report (`report.json`) holds tau per
category, per-position acceptance, tokens/s, speedup (mean, std, min, max over repeats), the
greedy identity rate, peak memory, hardware, versions, the checkpoint hash and the
losslessness certificate (`draftzoo.eval.certificate`, sampled at T = 1); `summary.txt`
says the same for people. `teacher_forced` (EAGLE) adds the chain's teacher-forced acceptance
per draft step on the target's own continuations of the same prompts.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import platform
import resource
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from ..architectures.config_io import ConfigError, check_seed
from ..architectures.defaults import (
    MAX_CACHE_LENGTH,
    MAX_NEW_TOKENS,
    target_provenance,
)
from ..architectures.drafter_io import checkpoint_hash
from ..architectures.families import family_spec, family_specs
from ..architectures.output_folders import output_path, write_text_atomically
from ..architectures.target import TARGET_DTYPES, TargetAdapter
from ..data.dedupe import TrainingText, training_text
from ..data.prompts import Prompt, PromptSetError, load_prompt_set
from ..inference.batch import BatchGenerator
from ..inference.cache_settings import CacheSettings
from ..inference.drafter_runtime import DrafterRuntime
from ..inference.generate import SpeculativeGenerator
from ..inference.model_free import model_free_specs
from ..inference.proposal_settings import (
    ProposalSettings,
    config_record,
    describe_serving,
    from_config,
    serving_record,
)
from ..inference.sampling import ACCEPTANCES, SamplingParams
from .certificate import CertificateConfig, certify, describe
from .lm_quality import repeated_ngram_share
from .machine_load import MachineLoad, cuda_device_uuid, timing_verdict, unreliable_sentence

REPORT_FILE = "report.json"
SUMMARY_FILE = "summary.txt"
REPORT_VERSION = 1


@dataclass(frozen=True)
class EvalConfig:
    """What `draftzoo eval` measures."""

    prompt_sets: tuple[str, ...] = ("humaneval",)  # names, question files, hf:NAME[:SPLIT[:COL]]
    max_prompts: int = 20  # per prompt set (after the warm-up prompt)
    #: training data (data.source files or names): prompts overlapping it are dropped before
    #: the first `max_prompts` are taken, and counted in the report (`draftzoo.data.dedupe`)
    heldout_from: tuple[str, ...] = ()
    max_new_tokens: int = MAX_NEW_TOKENS
    temperatures: tuple[float, ...] = (0.0, 1.0)
    batch_sizes: tuple[int, ...] = (1,)
    repeats: int = 1  # full reruns, for the speedup's spread
    #: how the drafter is asked to propose: chain or tree, length, hybrid rule (a report's
    #: config holds it flat, `proposal_settings.config_record`); a fixed length
    proposal: ProposalSettings = field(default_factory=ProposalSettings)
    #: "exact" (lossless) or "typical" (Medusa's typical acceptance: LOSSY at T > 0); the
    #: target-only baseline always samples exactly
    acceptance: str = "exact"
    chat: bool = True  # render prompts with the target's chat template
    seed: int = 0
    #: preallocated KV caches for the target and the drafter, target-only and speculative
    #: decoding alike; on CUDA their decode forwards replay as CUDA graphs
    static_cache: bool = False
    #: with `static_cache`: positions each static cache holds (prompt and new tokens)
    max_cache_length: int = MAX_CACHE_LENGTH
    #: verification forwards on packed weights and in-place grouped-query attention
    #: (`inference/cpu_kernels.py`): None = where they apply (a float32 CPU target, torch
    #: with MKL), False = torch's stock kernels; the report's `serving` says which ran
    cpu_kernels: bool | None = None
    #: EAGLE drafters: also score the chain's acceptance per draft step, teacher-forced on the
    #: target's own continuations (`draftzoo.eval.teacher_forced`), no speculative decoding
    teacher_forced: bool = False
    #: with `teacher_forced`: also split the first draft step's acceptance by the sequence
    #: position its draft lands at, [0, e_1), [e_1, e_2), ..., [e_last, end) (increasing)
    position_edges: tuple[int, ...] = ()
    #: the losslessness certificate (`draftzoo.eval.certificate`): sampled decodes at T = 1 per
    #: prompt; 0 = none (publish then refuses the report)
    certificate_samples: int = CertificateConfig.samples
    certificate_prompts: int = CertificateConfig.prompts  # the first evaluation prompts
    #: the target's weights, and so the drafter's: "float32", or "bfloat16" / "float16" where
    #: the hardware multiplies them natively (a CPU with AVX512-BF16 or AMX, a GPU)
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not isinstance(self.proposal, ProposalSettings):
            raise ValueError(f"proposal is a ProposalSettings, got {self.proposal!r}")
        if not self.prompt_sets:
            raise ValueError("give at least one prompt set")
        if self.max_prompts < 1 or self.max_new_tokens < 1 or self.repeats < 1:
            raise ValueError("max_prompts, max_new_tokens and repeats must be >= 1")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ValueError("temperatures must be >= 0")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ValueError("batch sizes must be >= 1")
        if self.acceptance not in ACCEPTANCES:
            raise ValueError(f"acceptance must be one of {ACCEPTANCES}, got {self.acceptance!r}")
        if self.proposal.num_speculative_tokens is None:
            raise ValueError("an evaluation fixes num_speculative_tokens (it compares runs)")
        if self.max_cache_length < 1:
            raise ValueError("max_cache_length must be >= 1")
        check_seed(self.seed)  # prompt and repeat offsets are added to it
        if self.certificate_samples < 0 or self.certificate_prompts < 1:
            raise ValueError("certificate samples must be >= 0 and certificate prompts >= 1")
        if self.dtype not in TARGET_DTYPES:
            raise ValueError(f"dtype must be one of {sorted(TARGET_DTYPES)}, got {self.dtype!r}")
        if self.position_edges and not self.teacher_forced:
            raise ValueError(
                "position_edges split the teacher-forced scores: also set teacher_forced "
                "(--teacher-forced)"
            )
        edges = (0, *self.position_edges)
        if any(b <= a for a, b in itertools.pairwise(edges)):
            raise ValueError(f"position_edges must increase from above 0, got {edges[1:]}")

    @classmethod
    def from_report(cls, report: dict[str, Any]) -> EvalConfig:
        """The configuration a report was measured with (its lists back to tuples)."""
        known = {f.name for f in fields(cls)} - {"proposal"}
        saved = {k: tuple(v) if isinstance(v, list) else v for k, v in report["config"].items()}
        settings = from_config(report["config"])
        return cls(proposal=settings, **{k: v for k, v in saved.items() if k in known})

    def record(self) -> dict[str, Any]:
        """The configuration as a report holds it (the proposal flat, by flag name)."""
        record = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "proposal"}
        return {**config_record(self.proposal), **record}

    @property
    def num_speculative_tokens(self) -> int:
        """Draft tokens a round (a tree's depth replaces it)."""
        return self.proposal.num_speculative_tokens

    @property
    def certificate(self) -> CertificateConfig | None:
        """The certificate's settings, or None when it is switched off."""
        if not self.certificate_samples:
            return None
        return CertificateConfig(prompts=self.certificate_prompts, samples=self.certificate_samples)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The weights' dtype as torch names it."""
        return TARGET_DTYPES[self.dtype]

    @property
    def cache(self) -> CacheSettings:
        """The KV caches both sides decode on."""
        return CacheSettings(
            static=self.static_cache, max_length=self.max_cache_length, cpu_kernels=self.cpu_kernels
        )


@dataclass
class _Run:
    """Counters of one (method, prompt) decode."""

    tokens: int = 0
    seconds: float = 0.0
    forwards: int = 0
    drafts: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    decodes: int = 0
    repetition: float = 0.0  # summed repeated-4-gram shares of the outputs

    def add(self, out, seconds: float) -> None:
        self.decodes += 1
        self.repetition += repeated_ngram_share(out.token_ids)
        m = out.metrics
        self.tokens += m.num_generated_tokens
        self.seconds += seconds
        self.forwards += m.num_target_forwards
        self.drafts += m.num_drafts
        self.draft_seconds += m.draft_seconds
        self.verify_seconds += m.verify_seconds


def load_prompts(config: EvalConfig) -> list[Prompt]:
    """The first `max_prompts` + 1 prompts of every set (the very first is the warm-up), past
    those that overlap `heldout_from`; at least one is measured."""
    prompts: list[Prompt] = []
    for index, name in enumerate(config.prompt_sets):
        chosen = _held_out(load_prompt_set(name), config.heldout_from)
        prompts += chosen[: config.max_prompts + (1 if index == 0 else 0)]
    if len(prompts) < 2:
        raise PromptSetError(
            f"{' + '.join(config.prompt_sets)}: {len(prompts)} usable prompt(s); eval needs at "
            "least 2 (the first is an uncounted warm-up)"
        )
    return prompts


@functools.lru_cache(maxsize=2)
def _training_text(sources: tuple[str, ...]) -> TrainingText:
    return training_text(sources)


def _held_out(prompts: list[Prompt], sources: tuple[str, ...]) -> list[Prompt]:
    if not sources:
        return prompts
    text = _training_text(sources)
    return [p for p in prompts if not text.overlaps(p.text)]


def heldout_record(config: EvalConfig) -> dict[str, Any] | None:
    """What the held-out check found: the training sources (with hashes), the window, and per
    prompt set how many prompts it has and how many overlap the training data (None without
    `heldout_from`)."""
    if not config.heldout_from:
        return None
    text = _training_text(config.heldout_from)
    sets = {}
    for name in config.prompt_sets:
        prompts = load_prompt_set(name)
        sets[name] = {
            "prompts": len(prompts),
            "overlapping": len(prompts) - len(_held_out(prompts, config.heldout_from)),
        }
    return {"sources": text.sources, "ngram": text.n, "sets": sets}


def _module_bytes(module) -> int:
    tensors = list(module.parameters()) + list(module.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def environment(device: torch.device | None = None) -> dict[str, Any]:
    """Hardware and versions, as the report records them (and the device measured on)."""
    import transformers

    from .. import __version__

    hardware = {
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        **_cpu_description(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    if device is not None:
        hardware["device"] = str(device)
    versions = {
        "draftzoo": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    return {"hardware": hardware, "versions": versions}


def _cpu_description() -> dict[str, Any]:
    """The CPU's model name and whether it has native bf16 (AVX512-BF16 or AMX), from
    /proc/cpuinfo where there is one: reports from different CPUs must not be compared as
    one ("x86_64" says nothing)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"cpu_model": platform.processor() or platform.machine(), "cpu_native_bf16": None}
    fields: dict[str, str] = {}
    for line in text.splitlines():  # the first processor's fields
        key, colon, value = line.partition(":")
        if colon:
            fields.setdefault(key.strip(), value.strip())
    model, flags = fields.get("model name", ""), set(fields.get("flags", "").split())
    return {
        "cpu_model": model or platform.machine(),
        "cpu_native_bf16": bool(flags & {"avx512_bf16", "amx_bf16"}),
    }


class Evaluation:
    """One drafter evaluated against its target under one `EvalConfig`."""

    def __init__(self, target, tokenizer, drafter: DrafterRuntime, config: EvalConfig) -> None:
        self.target, self.tokenizer, self.drafter, self.config = target, tokenizer, drafter, config
        static = {"cache": config.cache}
        self.plain = SpeculativeGenerator(target, tokenizer, **static)
        self.speculative = SpeculativeGenerator(
            target, tokenizer, drafter.make_proposer(), drafter.num_speculative_tokens, **static
        )
        #: {batch size: (target-only, speculative)}, kept across temperatures and repeats (a
        #: static cache keeps its buffers and graphs)
        self._batched_generators: dict[int, tuple[BatchGenerator, BatchGenerator]] = {}
        self.peak_cache_bytes = 0

    def _params(self, temperature: float, index: int, repeat: int) -> dict[str, SamplingParams]:
        """{"target": exact sampling, "speculative": with the configured acceptance}."""
        seed = self.config.seed + 1000 * repeat + index
        exact = SamplingParams(
            temperature=temperature, max_new_tokens=self.config.max_new_tokens, seed=seed
        )
        return {"target": exact, "speculative": replace(exact, acceptance=self.config.acceptance)}

    def run(self, prompts: list[Prompt], progress=None) -> list[dict[str, Any]]:
        """One result per (temperature, batch size)."""
        texts = [p.render(self.tokenizer, self.config.chat) for p in prompts]
        results = []
        for temperature in self.config.temperatures:
            for batch_size in self.config.batch_sizes:
                repeats = []
                rounds = _hybrid_rounds(self.speculative.proposer)
                for repeat in range(self.config.repeats):
                    self.drafter.begin_pass()
                    if batch_size == 1:
                        repeats.append(self._batch_one(texts, temperature, repeat, progress))
                    else:
                        repeats.append(
                            self._batched(texts, batch_size, temperature, repeat, progress)
                        )
                result = self._summarize(prompts, repeats, temperature, batch_size)
                rounds = _hybrid_rounds(self.speculative.proposer) - rounds
                if batch_size == 1 and rounds:
                    result["hybrid_rounds"] = {k: rounds[k] for k in sorted(rounds)}
                results.append(result)
        return results

    def _batch_one(self, texts, temperature, repeat, progress) -> dict[str, Any]:
        runs: dict[str, list[_Run]] = {"target": [], "speculative": []}
        per_pos: list[int] = []
        identical = []
        for index, text in enumerate(texts):
            params = self._params(temperature, index, repeat)
            order = ("target", "speculative") if index % 2 == 0 else ("speculative", "target")
            outs = {}
            for name in order:
                generator = self.plain if name == "target" else self.speculative
                began = time.perf_counter()
                outs[name] = generator.generate(text, params[name])
                seconds = time.perf_counter() - began
                run = _Run()
                run.add(outs[name], seconds)
                runs[name].append(run)
            spec = outs["speculative"].metrics
            self.peak_cache_bytes = max(self.peak_cache_bytes, spec.peak_cache_bytes)
            if index > 0:
                _add_positions(per_pos, spec.num_accepted_tokens_per_pos)
            identical.append(outs["speculative"].token_ids == outs["target"].token_ids)
            if progress is not None:
                progress.update(1)
        return {"runs": runs, "per_pos": per_pos, "identical": identical}

    def _batch_generators(self, batch_size: int) -> tuple[BatchGenerator, BatchGenerator]:
        if batch_size not in self._batched_generators:
            static = {"cache": self.config.cache}
            plain = BatchGenerator(self.target, self.tokenizer, None, 0, **static)
            speculative = BatchGenerator(
                self.target,
                self.tokenizer,
                self.drafter.make_proposer,
                self.drafter.num_speculative_tokens,
                max_speculative_batch=batch_size,
                **static,
            )
            self._batched_generators[batch_size] = plain, speculative
        return self._batched_generators[batch_size]

    def _batched(self, texts, batch_size, temperature, repeat, progress) -> dict[str, Any]:
        plain, speculative = self._batch_generators(batch_size)
        runs: dict[str, list[_Run]] = {"target": [], "speculative": []}
        per_pos: list[int] = []
        identical: list[bool] = []
        params = self._params(temperature, 0, repeat)
        # the warm-up prompt first, as a whole batch (its first row kept, not counted: the
        # batch's shapes are warmed up), then chunks of `batch_size`
        chunks = [texts[:1] * batch_size]
        chunks += [texts[i : i + batch_size] for i in range(1, len(texts), batch_size)]
        for number, chunk in enumerate(chunks):
            order = ("target", "speculative") if number % 2 == 0 else ("speculative", "target")
            outs = {}
            for name in order:
                generator = plain if name == "target" else speculative
                outs[name] = generator.generate(chunk, params[name])
            kept = {n: b.outputs[:1] if number == 0 else b.outputs for n, b in outs.items()}
            for name in ("target", "speculative"):
                # the chunk's wall time, shared out by tokens so per-prompt sums stay exact
                batch = outs[name]
                total = sum(o.metrics.num_generated_tokens for o in batch.outputs) or 1
                for out in kept[name]:
                    run = _Run()
                    run.add(out, batch.total_seconds * out.metrics.num_generated_tokens / total)
                    runs[name].append(run)
            for spec, ref in zip(kept["speculative"], kept["target"], strict=True):
                self.peak_cache_bytes = max(self.peak_cache_bytes, spec.metrics.peak_cache_bytes)
                if number > 0:
                    _add_positions(per_pos, spec.metrics.num_accepted_tokens_per_pos)
                identical.append(spec.token_ids == ref.token_ids)
            if progress is not None:
                progress.update(len(kept["target"]))
        return {"runs": runs, "per_pos": per_pos, "identical": identical}

    def _summarize(self, prompts, repeats, temperature, batch_size) -> dict[str, Any]:
        categories: dict[str, dict[str, _Run]] = defaultdict(
            lambda: {"target": _Run(), "speculative": _Run()}
        )
        speedups = []
        per_pos_total: list[int] = []
        total = {"target": _Run(), "speculative": _Run()}
        for rep in repeats:
            rep_total = {"target": _Run(), "speculative": _Run()}
            for index, prompt in enumerate(prompts):
                if index == 0:
                    continue  # warm-up
                for name in ("target", "speculative"):
                    run = rep["runs"][name][index]
                    for bucket in (categories[prompt.category][name], rep_total[name], total[name]):
                        _merge(bucket, run)
            speedups.append(_rate(rep_total["speculative"]) / _rate(rep_total["target"]))
            _add_positions(per_pos_total, rep["per_pos"])
        spec = total["speculative"]
        counted = len(prompts) - 1
        result: dict[str, Any] = {
            "temperature": temperature,
            "batch_size": batch_size,
            "prompts": counted,
            "tau": spec.tokens / max(1, spec.forwards),
            "acceptance_per_position": [n / max(1, spec.drafts) for n in per_pos_total],
            "tokens_per_second": {
                "target": _rate(total["target"]),
                "speculative": _rate(spec),
            },
            "speedup": _spread(speedups),
            # output quality beside speed: typical acceptance (lossy) may change it
            "repeated_4gram_share": {
                name: run.repetition / max(1, run.decodes) for name, run in total.items()
            },
            "draft_ms_per_round": 1e3 * spec.draft_seconds / max(1, spec.forwards),
            "verify_ms_per_round": 1e3 * spec.verify_seconds / max(1, spec.forwards),
            "categories": _by_category(prompts[1:], categories),
            # per prompt (first repeat): tokens and verification forwards, for exact re-checks
            "per_prompt": [
                {"id": prompt.prompt_id, "tokens": run.tokens, "forwards": run.forwards}
                for prompt, run in zip(
                    prompts[1:], repeats[0]["runs"]["speculative"][1:], strict=True
                )
            ],
        }
        if temperature == 0:
            same = [ok for rep in repeats for ok in rep["identical"][1:]]
            result["greedy_identity"] = {
                "identical": sum(same),
                "decodes": len(same),
                "rate": sum(same) / max(1, len(same)),
                "reference": "target-only at the same batch size",
            }
        return result


def _hybrid_rounds(proposer) -> Counter:
    """A hybrid proposer's rounds so far by the rule's choice (every decode, the warm-up
    prompt's included); empty for other proposers."""
    return Counter(getattr(proposer, "choices", None) or {})


def _by_category(prompts, categories: dict[str, dict[str, _Run]]) -> dict[str, dict]:
    """Prompts, tau and speedup of each prompt category."""
    return {
        name: {
            "prompts": sum(1 for p in prompts if p.category == name),
            "tau": runs["speculative"].tokens / max(1, runs["speculative"].forwards),
            "speedup": _rate(runs["speculative"]) / _rate(runs["target"]),
        }
        for name, runs in categories.items()
    }


def _add_positions(into: list[int], counts: list[int]) -> None:
    into.extend([0] * (len(counts) - len(into)))
    for k, n in enumerate(counts):
        into[k] += n


def _merge(into: _Run, run: _Run) -> None:
    for name in asdict(run):
        setattr(into, name, getattr(into, name) + getattr(run, name))


def _rate(run: _Run) -> float:
    return run.tokens / run.seconds if run.seconds > 0 else 0.0


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "per_repeat": values,
    }


def _decoded_checkpoint(drafter: DrafterRuntime) -> str | None:
    """The hash of the weights this evaluation decodes with: taken when they were loaded (a
    runtime built by hand: hashed now, before any decode); None for model-free proposers."""
    if drafter.family in model_free_specs():
        return None
    return drafter.sha256 or checkpoint_hash(drafter.folder)


def check_teacher_forced(config: EvalConfig, family: str, folder) -> None:
    """Refuse teacher-forced scores for a family that has none (said before anything loads)."""
    if config.teacher_forced and not family_spec(family).teacher_forced:
        scored = [s.display_name for s in family_specs().values() if s.teacher_forced]
        raise ConfigError(
            f"--teacher-forced scores {', '.join(scored)} drafters; {folder} is a "
            f"{family_spec(family).display_name} drafter"
        )


def evaluate(
    target,
    tokenizer,
    drafter: DrafterRuntime,
    config: EvalConfig,
    target_name: str,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run the evaluation; the report as a dict."""
    from tqdm.auto import tqdm

    check_teacher_forced(config, drafter.family, drafter.folder)
    digest = _decoded_checkpoint(drafter)
    prompts = load_prompts(config)
    evaluation = Evaluation(target, tokenizer, drafter, config)
    steps = len(prompts) * len(config.temperatures) * len(config.batch_sizes) * config.repeats
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    with (
        tqdm(total=steps, desc="eval", unit="prompt", disable=not show_progress) as progress,
        MachineLoad(cuda_device_uuid(next(target.parameters()).device)) as load,
    ):
        results = evaluation.run(prompts, progress)
    spreads = [r["speedup"]["std"] / r["speedup"]["mean"] for r in results if r["speedup"]["mean"]]
    memory = _memory(target, drafter, evaluation.peak_cache_bytes)
    teacher_forced = _teacher_forced(target, tokenizer, drafter, config, prompts[1:])
    return {
        "version": REPORT_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "checkpoint": _checkpoint(drafter, digest),
        "target": {
            "name": target_name,
            "fingerprint": TargetAdapter(target, tokenizer).fingerprint().to_dict(),
            "converted_from": target_provenance(target_name),
        },
        "config": config.record(),
        "serving": {
            "acceptance": config.acceptance,
            "lossy": config.acceptance != "exact",
            "verification_kernels": config.cache.kernels_note(target),
            **serving_record(drafter.settings),
        },
        "categories": sorted({p.category for p in prompts[1:]}),
        "heldout": heldout_record(config),
        "results": results,
        "timing": timing_verdict(load.record, spreads),
        "teacher_forced": teacher_forced,
        "certificate": certificate_of(target, tokenizer, drafter, config, prompts[1:]),
        "memory": memory,
        "seconds": time.perf_counter() - started,
        **environment(next(target.parameters()).device),
    }


def _checkpoint(drafter: DrafterRuntime, digest: str | None) -> dict[str, Any]:
    """The report's `checkpoint`: what was decoded, and where it came from."""
    record = drafter.record
    return {
        "path": str(drafter.folder),
        # the weights decoded; model-free proposers have none (and nothing to publish)
        "sha256": digest,
        "family": record["family"],
        "training": record.get("training", {}),
        # a drafter trained elsewhere and converted by `draftzoo import`: where from
        "imported": _provenance(record),
    }


def _provenance(record: dict[str, Any]) -> dict[str, Any] | None:
    """An imported drafter's layout and source files' hash (None for draftzoo's own)."""
    imported = record.get("imported")
    if not imported:
        return None
    return {key: imported.get(key) for key in ("layout", "sha256", "notes")}


def _memory(target, drafter: DrafterRuntime, peak_cache_bytes: int) -> dict[str, Any]:
    """What the evaluation held: weights, the peak KV caches, the process's peak memory."""
    memory = {
        "target_bytes": _module_bytes(target),
        "drafter_bytes": _module_bytes(drafter.module),
        "peak_kv_cache_bytes": peak_cache_bytes,  # measured in batch-1 decodes
        "process_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "cuda_peak_allocated_bytes": (
            torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
        ),
    }
    memory["target_drafter_caches_bytes"] = (
        memory["target_bytes"] + memory["drafter_bytes"] + memory["peak_kv_cache_bytes"]
    )
    return memory


def _teacher_forced(target, tokenizer, drafter: DrafterRuntime, config, prompts) -> dict | None:
    """The teacher-forced estimates on the measured prompts, when the config asks for them."""
    if not config.teacher_forced:
        return None
    from .teacher_forced import teacher_forced_results

    return teacher_forced_results(
        target,
        tokenizer,
        drafter.module,
        [p.render(tokenizer, config.chat) for p in prompts],
        config.temperatures,
        config.max_new_tokens,
        config.num_speculative_tokens,
        config.seed + 1,  # the seeds of the first repeat's decodes (0 is the warm-up)
        config.position_edges,
    )


def certificate_of(
    target, tokenizer, drafter: DrafterRuntime, config: EvalConfig, prompts: list[Prompt]
) -> dict[str, Any] | None:
    """The losslessness certificate of `drafter` as evaluated (None when switched off)."""
    settings = config.certificate
    if settings is None:
        return None
    texts = [p.render(tokenizer, config.chat) for p in prompts]
    return certify(
        target,
        tokenizer,
        drafter.make_proposer,
        texts,
        settings,
        config.acceptance,
        config.seed,
        config.cache,
    )


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """The batch-1 numbers per temperature: tau, speedup, identity (for cards and the index)."""
    out = {}
    for result in report["results"]:
        if result["batch_size"] != 1:
            continue
        key = f"T={result['temperature']:g}"
        out[key] = {
            "tau": round(result["tau"], 3),
            "speedup": round(result["speedup"]["mean"], 3),
        }
        if "greedy_identity" in result:
            out[key]["greedy_identity_rate"] = result["greedy_identity"]["rate"]
    return out


def batch_one_breakdown(report: dict[str, Any]) -> list[tuple[float, str, str]]:
    """(temperature, "cat tau, ...", "a1 a2 ...") of every batch-1 result."""
    return [
        (
            r["temperature"],
            ", ".join(f"{n} {c['tau']:.2f}" for n, c in sorted(r["categories"].items())),
            " ".join(f"{a:.2f}" for a in r["acceptance_per_position"]),
        )
        for r in report["results"]
        if r["batch_size"] == 1
    ]


def _repeat_split(entry: dict[str, Any]) -> str:
    """The first step's repeated/fresh split of a teacher-forced entry as a clause to append,
    or "" for reports written before the split existed."""
    if "first_step_repeated" not in entry:
        return ""
    repeated, fresh = entry["first_step_repeated"], entry["first_step_fresh"]
    return (
        f"; first step on repeated bigrams {repeated['acceptance']:.3f} "
        f"({repeated['positions']}), fresh {fresh['acceptance']:.3f} ({fresh['positions']})"
    )


def _position_split(entry: dict[str, Any]) -> str:
    """The first step's split by draft position as a clause to append, or "" without one."""
    buckets = entry.get("first_step_by_position")
    if not buckets:
        return ""
    parts = [
        f"{b['start']}-{'' if b['end'] is None else b['end'] - 1} {b['acceptance']:.3f} "
        f"({b['positions']})"
        for b in buckets
    ]
    return "; first step by draft position " + ", ".join(parts)


def teacher_forced_breakdown(report: dict[str, Any]) -> list[tuple[float, str]]:
    """(temperature, "tau .. (.. steps, .. positions); acceptance per step ..; ..") of every
    teacher-forced entry (none without `--teacher-forced`)."""
    return [
        (
            r["temperature"],
            f"tau {r['tau']:.2f} ({r['steps']} steps, {r['positions']} positions); acceptance "
            f"per step {' '.join(f'{a:.3f}' for a in r['acceptance_per_step'])}; target mass "
            f"outside the draft vocabulary {r['outside_mass']:.3f}{_repeat_split(r)}"
            f"{_position_split(r)}",
        )
        for r in report.get("teacher_forced") or []
    ]


def heldout_dropped(report: dict[str, Any]) -> str | None:
    """Per prompt set, how many prompts overlapped the training data and were dropped
    ("humaneval 0/164, ..."); None when the report made no held-out check."""
    heldout = report.get("heldout")
    if not heldout:
        return None
    return ", ".join(
        f"{name} {found['overlapping']}/{found['prompts']}"
        for name, found in heldout["sets"].items()
    )


def _heldout_line(report: dict[str, Any]) -> list[str]:
    dropped = heldout_dropped(report)
    return [f"heldout   overlapping the training data, dropped: {dropped}"] if dropped else []


def summary_text(report: dict[str, Any]) -> str:
    """The human summary of a report."""
    ck, cfg = report["checkpoint"], report["config"]
    lines = [
        f"drafter   {ck['path']}  ({ck['family']}, sha256 {(ck['sha256'] or 'none')[:16]})",
        f"target    {report['target']['name']} ({cfg.get('dtype', 'float32')})",
        f"prompts   {', '.join(cfg['prompt_sets'])}: {report['results'][0]['prompts']} "
        f"(+1 warm-up), {cfg['max_new_tokens']} new tokens, {cfg['repeats']} repeat(s)",
        *_heldout_line(report),
        f"proposal  {describe_serving(report['serving'], ck['family'])}, "
        f"{report['serving']['num_speculative_tokens']} tokens deep",
        *_lossy_line(report),
        "",
        f"{'T':>4} {'batch':>5} {'tau':>6} {'target tok/s':>13} {'spec tok/s':>11} "
        f"{'speedup':>14} {'draft/verify ms':>16} {'identity':>9} {'rep-4 tgt/spec':>15}",
    ]
    for r in report["results"]:
        s = r["speedup"]
        spread = f"{s['mean']:.2f}x±{s['std']:.2f}"
        ident = r.get("greedy_identity")
        shown = f"{ident['identical']}/{ident['decodes']}" if ident else "-"
        lines.append(
            f"{r['temperature']:>4g} {r['batch_size']:>5} {r['tau']:>6.2f} "
            f"{r['tokens_per_second']['target']:>13.1f} "
            f"{r['tokens_per_second']['speculative']:>11.1f} {spread:>14} "
            f"{r['draft_ms_per_round']:>7.2f}/{r['verify_ms_per_round']:<8.2f} {shown:>9} "
            f"{_repetition(r):>15}"
        )
    lines.append("")
    warning = unreliable_sentence(report)
    if warning:
        lines += [warning, ""]
    for temperature, cats, accept in batch_one_breakdown(report):
        lines.append(f"T={temperature:g}: tau per category: {cats}")
        lines.append(f"T={temperature:g}: acceptance per position: {accept}")
    for temperature, text in teacher_forced_breakdown(report):
        lines.append(f"T={temperature:g}: teacher-forced {text}")
    lines.append(describe(report.get("certificate")))
    drift = report.get("target_drift")
    if drift:
        agreement = drift["greedy_agreement"]
        lines.append(
            f"target drift: held-out loss {drift.get('heldout_loss_original', float('nan')):.4f}"
            f" -> {drift.get('heldout_loss_adapted', float('nan')):.4f}, KL(original || "
            f"adapted) {drift.get('kl_original_adapted', float('nan')):.5f}; greedy agreement "
            f"{agreement['identical']}/{agreement['prompts']} identical; identity checked "
            f"against {drift['identity_checked_against']}"
        )
    m = report["memory"]
    lines.append(
        f"memory: target {m['target_bytes'] / 2**20:.1f} MiB + drafter "
        f"{m['drafter_bytes'] / 2**20:.1f} MiB + peak KV caches "
        f"{m['peak_kv_cache_bytes'] / 2**20:.2f} MiB; process peak RSS "
        f"{m['process_peak_rss_bytes'] / 2**20:.0f} MiB"
    )
    return "\n".join(lines) + "\n"


def _repetition(result: dict[str, Any]) -> str:
    """Repeated-4-gram share of target-only / speculative outputs ('-' in older reports)."""
    shares = result.get("repeated_4gram_share")
    return f"{shares['target']:.3f}/{shares['speculative']:.3f}" if shares else "-"


def _lossy_line(report: dict[str, Any]) -> list[str]:
    """A warning line for a report measured with a lossy acceptance."""
    if not report["serving"].get("lossy"):
        return []
    return [
        f"LOSSY     {report['serving']['acceptance']} acceptance: at T > 0 the output is NOT "
        "distributed as the target's (repeated-4-gram share per row shows its effect)"
    ]


def write_report(report: dict[str, Any], output_dir: Path) -> Path:
    """report.json and summary.txt in `output_dir` (each written whole, then renamed)."""
    output_dir = output_path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (
        (REPORT_FILE, json.dumps(report, indent=1) + "\n"),
        (SUMMARY_FILE, summary_text(report)),
    ):
        write_text_atomically(output_dir / name, text)
    return output_dir / REPORT_FILE
