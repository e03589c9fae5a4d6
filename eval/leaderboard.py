"""`draftzoo leaderboard`: every drafter of a target ranked from its own eval report.

    draftzoo leaderboard --zoo recipes/zoo --output-dir recipes/zoo
    draftzoo leaderboard --report runs/families/reports/*/report.json \
        --references runs/families/references.json --output-dir bench/results/families

One row per report: family, proposal (chain or tree), parameters, training tokens and time,
tau and speedup at T = 0 and T = 1 (batch 1), efficiency (speedup / tau), draft and verify
milliseconds per round, the drafter's memory and its losslessness certificate. Rows are ranked
by T = 0 speedup only against rows measured alike: the same target, the same CPU or GPU and
thread count, the same prompt sets (chat-rendered or raw), prompts per set and new tokens, and
the same (exact or lossy) acceptance. Any other row goes into
its own table; a report that does not name its CPU is never ranked with another one.
Reference rows (target-only, prompt lookup, transformers' assisted generation) come from a
`references.json` that `bench/families.py` writes beside its reports; they follow the ranking.
Written: LEADERBOARD.md and leaderboard.png (speedup against training time per table, the
Pareto front of cheaper-and-faster drafters marked).
"""

from __future__ import annotations

import json
import logging
import math
import textwrap
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..architectures.config_io import ConfigError
from ..architectures.drafter_io import read_drafter_record
from ..architectures.families import display_name
from ..architectures.output_folders import (
    fresh_path,
    open_own_file,
    output_path,
    write_text_atomically,
)
from ..architectures.zoo_index import ZooIndex
from ..inference.model_free import model_free_specs
from ..inference.proposal_settings import describe_serving
from .certificate import headline as certificate_headline
from .engine_runs import EngineRunsError, leaderboard_section, read_engine_runs

logger = logging.getLogger(__name__)

LEADERBOARD_FILE = "LEADERBOARD.md"
#: what reading a damaged report raises (its JSON, its shape, its values)
UNREADABLE = (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError)
PLOT_FILE = "leaderboard.png"
#: the reference rows' names that no registry holds (families' and model-free proposers'
#: come from their registries)
REFERENCE_NAMES = {
    "target_only": "target-only",
    "transformers_assisted": "transformers assisted",
}


@dataclass
class Measured:
    """Batch-1 figures at one temperature."""

    tau: float | None
    speedup: float
    draft_ms: float | None = None
    verify_ms: float | None = None
    greedy_identity: str | None = None  # "24/24" at T = 0

    @property
    def efficiency(self) -> float | None:
        return self.speedup / self.tau if self.tau else None


@dataclass
class Row:
    """One drafter (or reference method) as the leaderboard shows it."""

    name: str
    family: str
    proposal: str  # "chain of 4", "tree (16 nodes)", ...
    group: str  # what it was measured on; rows rank only within one group
    temperatures: dict[str, Measured] = field(default_factory=dict)  # "T=0" -> figures
    parameters: int | None = None
    train_tokens: int | None = None
    train_seconds: float | None = None
    unrecorded_stage: bool = False  # it started from a stage whose budget was not recorded
    drafter_bytes: int | None = None
    certificate: dict[str, Any] | None = None
    card: str | None = None  # a link to the drafter's card, when it has one
    reference: bool = False  # target-only, prompt lookup, transformers: no training
    #: why its speedups cannot be trusted (measured on a busy machine); shown, never ranked
    unreliable: str | None = None
    imported: str | None = None  # the peer layout it was converted from (trained elsewhere)
    #: other engines' measurements of it (`engine_runs.json` in its zoo entry)
    engine_runs: list[dict[str, Any]] | None = None

    def speedup(self, key: str = "T=0") -> float:
        measured = self.temperatures.get(key)
        return measured.speedup if measured else float("-inf")


def group_of(report: dict[str, Any]) -> str:
    """What a report was measured on, as a label: rows with equal labels may be ranked."""
    hw, cfg = report["hardware"], report["config"]
    if hw.get("cuda") and hw.get("device", "cuda").startswith("cuda"):
        device = hw["cuda"]
    elif hw.get("cpu_model"):
        device = f"{hw['cpu_model']}, {hw['torch_threads']} threads"
    else:  # an older report: nothing says which CPU, so it stands alone
        where = report.get("checkpoint", {}).get("path", "?")
        device = f"CPU not recorded ({where}, {report.get('created', '?')})"
    prompts = " + ".join(cfg["prompt_sets"]) + ("" if cfg.get("chat", True) else " (raw)")
    label = (
        f"{report['target']['name']} on {device}; {prompts}, {cfg['max_prompts']} prompts each, "
        f"{cfg['max_new_tokens']} new tokens, batch 1"
    )
    if not report.get("serving", {}).get("verification_kernels", "stock").startswith("stock"):
        label += "; packed CPU kernels"
    if cfg.get("static_cache"):
        label += "; static caches"
    if cfg.get("dtype", "float32") != "float32":
        label += f"; {cfg['dtype']} weights"
    if cfg.get("acceptance", "exact") != "exact":  # lossy rows are never ranked with exact ones
        label += f"; LOSSY {cfg['acceptance']} acceptance"
    return label


def parameter_count(folder: Path) -> int | None:
    """Parameters stored in the drafter folder's safetensors files (an adapter included),
    read from their headers; None when the folder is not here."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors")) + sorted(
        Path(folder).glob("adapter/*.safetensors")
    )
    if not files:
        return None
    total = 0
    for path in files:
        with safe_open(str(path), "pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                total += math.prod(handle.get_slice(key).get_shape())
    return total


def training_budget(training: dict[str, Any]) -> tuple[int | None, float | None]:
    """(supervised tokens, seconds) of the whole training, a heads-only stage included."""
    stage = training.get("heads_stage", {})
    tokens = training.get("supervised_tokens")
    seconds = training.get("train_seconds")
    if tokens is not None and "supervised_tokens" in stage:
        tokens += stage["supervised_tokens"]
    if seconds is not None and "train_seconds" in stage:
        seconds += stage["train_seconds"]
    return tokens, seconds


def _unrecorded_stage(training: dict[str, Any], folder: Path | None) -> bool:
    """A Medusa-2 drafter trained before its heads-only stage was recorded."""
    if (
        "heads_stage" in training
        or folder is None
        or not (Path(folder) / "draftzoo.json").is_file()
    ):
        return False
    return bool(read_drafter_record(Path(folder)).get("recipe", {}).get("init_heads"))


def row_from_report(
    report: dict[str, Any], name: str, folder: Path | None = None, card: str | None = None
) -> Row:
    """A leaderboard row from an eval report (the drafter's folder, when here, for its size)."""
    checkpoint = report["checkpoint"]
    tokens, seconds = training_budget(checkpoint.get("training", {}))
    row = Row(
        name=name,
        family=checkpoint["family"],
        proposal=describe_serving(report["serving"], checkpoint["family"]),
        group=group_of(report),
        parameters=parameter_count(folder) if folder else None,
        train_tokens=tokens,
        train_seconds=seconds,
        unrecorded_stage=_unrecorded_stage(checkpoint.get("training", {}), folder),
        drafter_bytes=report["memory"]["drafter_bytes"],
        certificate=(
            certificate_headline(report["certificate"]) if report.get("certificate") else None
        ),
        card=card,
        reference=checkpoint["family"] in model_free_specs(),
        unreliable=(report.get("timing") or {}).get("why_unreliable"),
        imported=(checkpoint.get("imported") or {}).get("layout"),
    )
    for result in report["results"]:
        if result["batch_size"] != 1:
            continue
        identity = result.get("greedy_identity")
        row.temperatures[f"T={result['temperature']:g}"] = Measured(
            tau=result["tau"],
            speedup=result["speedup"]["mean"],
            draft_ms=result["draft_ms_per_round"],
            verify_ms=result["verify_ms_per_round"],
            greedy_identity=f"{identity['identical']}/{identity['decodes']}" if identity else None,
        )
    return row


def rows_from_zoo(zoo: Path, target: str | None = None) -> list[Row]:
    """A row per drafter of the zoo at `zoo` (for `target` only, when given)."""
    index = ZooIndex(zoo)
    rows = []
    for name, entry in index.entries().items():
        if target and entry["base_model"] != target:
            continue
        folder = index.folder(name)
        try:
            with open_own_file(folder / "report.json") as handle:  # never through a link
                report = json.loads(handle.read())
            row = row_from_report(report, name, folder, card=f"{name}/README.md")
            row.engine_runs = _engine_runs(folder, name)
            rows.append(row)
        except UNREADABLE as err:
            # one broken entry does not hide the others; it is named, not ranked
            logger.warning("zoo entry %s left out: its report.json cannot be read (%s)", name, err)
    return rows


def _engine_runs(folder: Path, name: str) -> list[dict[str, Any]] | None:
    """An entry's engine runs; a damaged file is named and left out, the entry kept."""
    try:
        return read_engine_runs(folder)
    except EngineRunsError as err:
        logger.warning("zoo entry %s: its engine runs left out (%s)", name, err)
        return None


def rows_from_references(path: Path) -> list[Row]:
    """Reference rows as `bench/families.py` writes them (`Row` fields as JSON)."""
    rows = []
    try:
        for saved in json.loads(Path(path).read_text()):
            measured = {k: Measured(**v) for k, v in saved.pop("temperatures").items()}
            rows.append(Row(**saved, temperatures=measured, reference=True))
    except UNREADABLE as err:
        raise ConfigError(f"--references {path}: not a reference-rows file ({err!r:.200})") from err
    return rows


def row_as_json(row: Row) -> dict[str, Any]:
    """A row as `rows_from_references` reads it back."""
    saved = asdict(row)
    saved.pop("reference")
    return saved


def grouped(rows: list[Row]) -> dict[str, list[Row]]:
    """Rows by group, drafters ranked by T = 0 speedup, then those with unreliable timings,
    then the reference rows."""
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        groups[row.group].append(row)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))  # largest first
    return {
        group: sorted(members, key=lambda r: (r.reference, bool(r.unreliable), -r.speedup()))
        for group, members in ordered
    }


def pareto_front(rows: list[Row], key: str = "T=0") -> list[Row]:
    """Trained rows no other row beats on both training time and speedup (cheapest first)."""
    trained = sorted(
        (
            r
            for r in rows
            if not r.reference and not r.unreliable and r.train_seconds and key in r.temperatures
        ),
        key=lambda r: (r.train_seconds, -r.speedup(key)),
    )
    front, best = [], float("-inf")
    for row in trained:
        if row.speedup(key) > best:
            front.append(row)
            best = row.speedup(key)
    return front


def _millions(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:.2f} M"


def _tokens(row: Row) -> str:
    """Training tokens, flagged when a first stage's budget is not on record."""
    text = _millions(row.train_tokens)
    return f"{text} + unrecorded heads stage" if row.unrecorded_stage else text


def _cell(row: Row, key: str) -> str:
    measured = row.temperatures.get(key)
    if measured is None:
        return "- | -"
    tau = "-" if measured.tau is None else f"{measured.tau:.2f}"
    return f"{tau} | {measured.speedup:.2f}x"


def _certificate_cell(row: Row) -> str:
    cert = row.certificate
    if row.reference and row.family not in model_free_specs():
        return "n/a"
    if not cert:
        return "none"
    if not cert.get("drafts_used", True):
        return "untested (no draft accepted)"
    verdict = "passed" if cert["passed"] else "FAILED"
    ratio = cert["worst_tv_over_threshold"]
    return f"{verdict} ({cert['prompts']}x{cert['samples']}, TV/thr {ratio:.2f})"


def _draft_verify(row: Row) -> str:
    measured = row.temperatures.get("T=0")
    if measured is None or measured.draft_ms is None:
        return "-"
    return f"{measured.draft_ms:.2f} / {measured.verify_ms:.2f}"


def _identity(row: Row) -> str:
    measured = row.temperatures.get("T=0")
    return measured.greedy_identity if measured and measured.greedy_identity else "-"


def _efficiency(row: Row) -> str:
    measured = row.temperatures.get("T=0")
    return "-" if measured is None or measured.efficiency is None else f"{measured.efficiency:.2f}"


def table(rows: list[Row]) -> list[str]:
    """One group's markdown table, ranked."""
    front = {r.name for r in pareto_front(rows)}
    lines = [
        "| rank | drafter | family | proposal | parameters | training tokens | training time "
        "| T=0 tau | T=0 speedup | T=0 efficiency | T=1 tau | T=1 speedup "
        "| draft / verify ms (T=0) | drafter MiB | greedy identity | certificate |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rank = 0
    for row in rows:
        ranked = not row.reference and not row.unreliable
        rank += ranked
        shown = "ref" if row.reference else str(rank) if ranked else "unreliable timing"
        name = f"[`{row.name}`]({row.card})" if row.card else f"`{row.name}`"
        if row.name in front:
            name += " *"
        seconds = "-" if row.train_seconds is None else f"{row.train_seconds / 60:.0f} min"
        memory = "-" if row.drafter_bytes is None else f"{row.drafter_bytes / 2**20:.1f}"
        lines.append(
            f"| {shown} | {name} | "
            f"{_shown_family(row.family, row.imported)} | {row.proposal} | "
            f"{_millions(row.parameters)} | {_tokens(row)} | {seconds} | "
            f"{_cell(row, 'T=0')} | {_efficiency(row)} | {_cell(row, 'T=1')} | "
            f"{_draft_verify(row)} | {memory} | {_identity(row)} | {_certificate_cell(row)} |"
        )
    return lines


def render(rows: list[Row], title: str, plot: str | None = PLOT_FILE) -> str:
    """LEADERBOARD.md: one ranked table per measurement group."""
    groups = grouped(rows)
    lines = [
        f"# {title}",
        "",
        "Generated by `draftzoo leaderboard` from each drafter's own eval report; do not edit.",
        "Ranked by T = 0 speedup over target-only decoding, measured in the same process on the",
        "same prompts (batch 1). Tables are measurement groups: rows in different tables were",
        "measured on other hardware or other prompts and are not ranked together. `*` marks the",
        "Pareto front (no other drafter is both cheaper to train and faster at T = 0).",
        "Efficiency is speedup / tau; the certificate is the sampled losslessness check at",
        "T = 1 (prompts x samples, worst TV over its threshold; docs/guarantees.md); greedy",
        'identity counts the T = 0 decodes identical to target-only. Rows marked "unreliable',
        'timing" were measured while other processes used the machine (their tau and identity',
        "hold, their speedups do not): shown, not ranked.",
    ]
    if plot:
        lines += ["", f"![speedup against training time]({plot})"]
    for number, (group, members) in enumerate(groups.items(), start=1):
        lines += ["", f"## {number}. {group}", "", *table(members)]
    served = [(row.name, row.engine_runs) for row in rows if row.engine_runs]
    if served:
        lines += [
            "",
            "## Served by other engines",
            "",
            "Measured by the engine itself (its own clock and counts; `engine_runs.json` in each",
            "entry, written by bench/llama_cpp_bench.py): tokens per second with the drafter",
            "and target-only on the same prompts in the same program, never ranked with the",
            "tables above.",
            *leaderboard_section(served),
        ]
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], path: Path) -> Path:
    """Speedup against training time, one panel per group and temperature, the Pareto front
    joined and the reference rows as horizontal lines."""
    from .plots import _pyplot

    plt = _pyplot()
    groups = grouped(rows)
    keys = ("T=0", "T=1")
    fig, axes = plt.subplots(len(groups), len(keys), figsize=(13, 4.5 * len(groups)), squeeze=False)
    for line, (group, members) in enumerate(groups.items()):
        for column, key in enumerate(keys):
            ax = axes[line][column]
            trained = [r for r in members if not r.reference and r.train_seconds]
            for row in trained:
                if key in row.temperatures:
                    x, y = row.train_seconds / 60, row.speedup(key)
                    ax.scatter([x], [y])
                    ax.annotate(
                        row.name, (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points"
                    )
            front = pareto_front(members, key)
            if front:
                ax.step(
                    [r.train_seconds / 60 for r in front],
                    [r.speedup(key) for r in front],
                    where="post",
                    linestyle="--",
                    color="gray",
                    label="Pareto front",
                )
            styles = iter([":", "-.", (0, (1, 3)), (0, (5, 5)), (0, (3, 1, 1, 1))] * 4)
            for row in members:
                if row.reference and key in row.temperatures:
                    ax.axhline(
                        row.speedup(key), linestyle=next(styles), linewidth=1, label=row.name
                    )
            ax.set_xlabel("training time (min, as recorded)")
            ax.set_ylabel(f"speedup over target-only, {key}")
            ax.set_title(textwrap.fill(f"{line + 1}. {group}", 80), fontsize=7)
            if ax.get_legend_handles_labels()[0]:  # a panel of untimed rows has nothing to name
                ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with fresh_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


def write(rows: list[Row], output_dir: Path, title: str) -> list[Path]:
    """LEADERBOARD.md and leaderboard.png in `output_dir` (each written whole, then renamed)."""

    output_dir = output_path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    plot(rows, output_dir / PLOT_FILE)
    write_text_atomically(output_dir / LEADERBOARD_FILE, render(rows, title))
    return [output_dir / LEADERBOARD_FILE, output_dir / PLOT_FILE]


README_START = "<!-- generated: draftzoo leaderboard --readme; do not edit -->"
README_END = "<!-- end of generated table -->"


def families_block(rows: list[Row], zoo_prefix: str = "recipes/zoo/") -> str:
    """The README's families table: one line per zoo drafter, best T = 0 speedup first within
    each measurement group, the groups listed below it."""
    groups = grouped(rows)
    lines = [
        README_START,
        "| family | zoo name (card) | proposal | training | T=0 tau / speedup "
        "| T=1 tau / speedup | certificate | measured |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for number, members in enumerate(groups.values(), start=1):
        for row in members:
            training = f"{_millions(row.train_tokens)} tokens"
            if row.unrecorded_stage:
                training += " + unrecorded heads stage"
            if row.train_seconds:
                training += f", {row.train_seconds / 60:.0f} min"
            t0, t1 = (_cell(row, key).replace(" | ", " / ") for key in ("T=0", "T=1"))
            if row.unreliable:
                t0, t1 = (f"{cell} (unreliable timing)" for cell in (t0, t1))
            lines.append(
                f"| {_shown_family(row.family)} | "
                f"[`{row.name}`]({zoo_prefix}{row.card}) | {row.proposal} | {training} | {t0} | "
                f"{t1} | {_certificate_cell(row)} | {number} |"
            )
    lines.append("")
    for number, group in enumerate(groups, start=1):
        lines.append(f"{number}. {group}")
    lines.append(README_END)
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """`text` with its generated block replaced by `block`."""
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"no generated block ({README_START} ... {README_END}) to replace")
    return text[:start] + block + text[end + len(README_END) :]


def _shown_family(family: str, imported: str | None = None) -> str:
    """A row's family or reference method as people read it (and the layout an imported
    drafter came from: it was trained elsewhere, on a budget not on record)."""
    model_free = model_free_specs().get(family)
    shown = model_free.display_name if model_free else REFERENCE_NAMES.get(family)
    shown = shown or display_name(family)
    return f"{shown} (imported: {imported})" if imported else shown


def collect_rows(
    zoos: list[Path],
    reports: list[Path],
    references: Path | None = None,
    target: str | None = None,
) -> list[Row]:
    """The rows of every drafter in `zoos`, every eval report in `reports` and the reference
    rows, only those measured on `target` when it is given; none at all is an error."""
    rows = [row for zoo in zoos for row in rows_from_zoo(zoo, target)]
    for path in reports:
        try:
            report = json.loads(path.read_text())
            if "results" not in report:
                raise KeyError("results")
            if target and report["target"]["name"] != target:
                continue
            folder = Path(report["checkpoint"]["path"])
            rows.append(row_from_report(report, folder.name, folder if folder.is_dir() else None))
        except UNREADABLE as err:
            raise ConfigError(f"--report {path}: not an eval report ({err!r:.200})") from err
    if references:
        rows += rows_from_references(references)
    if not rows:
        raise ConfigError("no drafters to rank: name a --zoo with entries or a --report")
    return rows


def update_readme(readme: Path, rows: list[Row]) -> None:
    """Rewrite the generated families table in `readme` from `rows`."""
    text = readme.read_text()
    try:
        updated = replace_block(text, families_block(rows))
    except ValueError as err:
        raise ConfigError(f"--readme {readme}: {err}") from err
    if readme.is_symlink():
        raise ConfigError(f"--readme {readme} is a symbolic link; name the file itself")
    write_text_atomically(readme, updated)
