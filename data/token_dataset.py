"""A conversation source -> a cached `datasets.Dataset` of token ids and loss masks.

Rows are normalised (`conversations`), rendered with the tokenizer's chat template and masked
(`loss_mask`), cut to `max_length`, optionally packed, and saved with `save_to_disk` under a key
made of the source's content hash, the tokenizer hash and these settings; the same key is the
`data_hash` a trained drafter records. The report of kept and malformed rows is saved beside it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..architectures.config_io import to_dict
from ..architectures.output_folders import fresh_dir
from ..architectures.target import tokenizer_hash
from .conversations import DataError, RowReport, iter_rows, iter_samples
from .loss_mask import TemplateError, Tokenized, tokenize_sample

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("right", "drop")


@dataclass(frozen=True)
class DataConfig:
    """Where conversations come from and how they become training rows."""

    source: str = ""  # a .jsonl/.json/.parquet file, a dataset folder, sharegpt, or a hub name
    split: str = "train"  # split of a hub dataset
    format: str = "auto"  # "auto", "sharegpt", "messages" or "text"
    max_length: int = 1024  # tokens per training row
    truncation: str = "right"  # "right": keep the first max_length tokens; "drop": skip the row
    packing: bool = False  # pack several samples into each row (attention stays per sample)
    strict: bool = False  # stop on the first malformed row instead of counting it
    max_samples: int | None = None  # use only the first N rows (None: all)
    heldout_rows: int = 0  # the last N rows are never trained on (held-out loss, calibration)

    def __post_init__(self) -> None:
        if not self.source:
            raise ValueError("data.source is required")
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(f"truncation must be one of {TRUNCATION_MODES}")
        if self.max_length < 2:
            raise ValueError("max_length must be >= 2")
        if self.heldout_rows < 0:
            raise ValueError("heldout_rows must be >= 0")


def source_hash(source: str, split: str) -> str:
    """Content hash of a local file or folder; the name and split of a hub dataset."""
    from .named_sources import named_source

    named = named_source(source)
    if named is not None:
        return named.content_hash()
    digest = hashlib.sha256()
    path = Path(source)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    if path.exists():
        for file in files:
            digest.update(file.name.encode())
            with file.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    else:
        digest.update(f"hub:{source}:{split}".encode())
    return digest.hexdigest()[:16]


def data_key(config: DataConfig, tokenizer) -> str:
    """The cache key and `data_hash`: source content, tokenizer and the settings that shape the
    rows (not `heldout_rows`, which only splits them: recipes that hold out differently share
    one tokenized dataset and one offline capture)."""
    shaping = {k: v for k, v in to_dict(config).items() if k not in ("source", "heldout_rows")}
    payload = {
        "source": source_hash(config.source, config.split),
        "tokenizer": tokenizer_hash(tokenizer),
        "template": getattr(tokenizer, "chat_template", None),
        "config": shaping,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _tokenized_rows(config: DataConfig, tokenizer, report: RowReport):
    rows = iter_rows(config.source, config.split)
    for count, sample in enumerate(iter_samples(rows, config.format, config.strict, report)):
        if config.max_samples is not None and count >= config.max_samples:
            break
        try:
            tokenized = tokenize_sample(tokenizer, sample)
        except TemplateError as err:
            if config.strict:
                raise DataError(f"row {sample.row}: {err} (strict mode)") from err
            report.kept -= 1
            report.add_malformed(sample.row, f"template: {err}")
            continue
        if len(tokenized.input_ids) > config.max_length:
            if config.truncation == "drop":
                report.kept -= 1
                report.add_malformed(sample.row, f"longer than max_length {config.max_length}")
                continue
            tokenized = Tokenized(
                tokenized.input_ids[: config.max_length], tokenized.loss_mask[: config.max_length]
            )
        if sum(tokenized.loss_mask[1:]) == 0:
            report.kept -= 1
            report.add_malformed(sample.row, "no supervised token within max_length")
            continue
        yield sample.row, tokenized


def _pack(items, max_length: int):
    """Greedy packing in order: each row holds whole samples up to `max_length` tokens."""
    row_ids, row_mask, lengths = [], [], []
    for _, item in items:
        if row_ids and len(row_ids) + len(item.input_ids) > max_length:
            yield {"input_ids": row_ids, "loss_mask": row_mask, "lengths": lengths}
            row_ids, row_mask, lengths = [], [], []
        row_ids = row_ids + item.input_ids
        row_mask = row_mask + item.loss_mask
        lengths = [*lengths, len(item.input_ids)]
    if row_ids:
        yield {"input_ids": row_ids, "loss_mask": row_mask, "lengths": lengths}


def build_token_dataset(config: DataConfig, tokenizer, cache_dir: Path):
    """The tokenized dataset (input_ids, loss_mask, lengths, index), its report and key.

    Cached under `cache_dir/<key>`; a second call with the same inputs loads it.
    """
    import datasets

    key = data_key(config, tokenizer)
    target = Path(cache_dir) / f"tokens-{key}"
    report_file = target / "draftzoo_report.json"
    if report_file.is_file():
        report = RowReport.from_dict(json.loads(report_file.read_text()))
        return datasets.load_from_disk(str(target)), report, key
    from tqdm.auto import tqdm

    report = RowReport()
    items = tqdm(
        _tokenized_rows(config, tokenizer, report),
        desc=f"tokenizing {config.source}",
        unit=" rows",
        mininterval=2.0,
    )
    if config.packing:
        rows = list(_pack(items, config.max_length))
    else:
        rows = [
            {"input_ids": t.input_ids, "loss_mask": t.loss_mask, "lengths": [len(t.input_ids)]}
            for _, t in items
        ]
    if not rows:
        raise DataError(
            f"{config.source}: no usable rows ({report.summary()}); first problems: "
            + "; ".join(report.examples)
        )
    for index, row in enumerate(rows):
        row["index"] = index
    dataset = datasets.Dataset.from_list(rows)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = fresh_dir(target)
    try:
        dataset.save_to_disk(str(tmp))
        (tmp / "draftzoo_report.json").write_text(json.dumps(report.to_dict()))
        shutil.rmtree(target, ignore_errors=True)  # an unfinished one (no report)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("tokenized %s: %s", config.source, report.summary())
    return datasets.load_from_disk(str(target)), report, key


def split_heldout(dataset, heldout_rows: int):
    """(training rows, held-out rows or None): the last `heldout_rows` rows are held out."""
    if not heldout_rows:
        return dataset, None
    if heldout_rows >= len(dataset):
        raise DataError(
            f"data.heldout_rows {heldout_rows} leaves no training rows: the data has "
            f"{len(dataset)} rows"
        )
    cut = len(dataset) - heldout_rows
    return dataset.select(range(cut)), dataset.select(range(cut, len(dataset)))
