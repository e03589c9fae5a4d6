"""`draftzoo demo`: the whole loop on the committed testbed-small target, in about ten minutes.

    draftzoo demo [--output-dir runs/demo] [--steps 600] [--prompts 10]

1. prepare the training data (testbed-chat, tokenized once and cached);
2. train a short EAGLE-3 drafter (`recipes/eagle3/testbed-small-demo.yaml`);
3. evaluate it and the shipped `eagle3-testbed-small` (the same recipe family at its full
   budget) on the same HumanEval prompts, T=0 and T=1, against target-only decoding;
4. publish the new drafter to a local zoo with its model card;
5. load it back by name;
6. generate with it.
"""

from __future__ import annotations

from pathlib import Path

from draftzoo.architectures.defaults import COMMITTED_TARGET, recipes_dir

DEMO_PROMPT = (
    "def is_palindrome(text: str) -> bool:\n"
    '    """Return True if text reads the same backwards."""\n'
)
SHIPPED = "eagle3-testbed-small"
STEPS = 6


def _say(step: int, text: str) -> None:
    print(f"[{step}/{STEPS}] {text}", flush=True)


def _prepare_data(recipe) -> None:
    """Tokenize the recipe's data into the cache training reads (a progress bar meanwhile)."""
    from transformers import AutoTokenizer

    from draftzoo.data.token_dataset import build_token_dataset
    from draftzoo.train.setup import cache_dir_of, target_path

    cache_dir = cache_dir_of(recipe)
    tokenizer = AutoTokenizer.from_pretrained(target_path(recipe.target))
    _, report, _ = build_token_dataset(recipe.data, tokenizer, cache_dir)
    print(f"      {report.summary()}", flush=True)


def _side_by_side(reports: dict[str, dict]) -> str:
    """tau, speedup over target-only and greedy identity of each drafter at each temperature,
    then each one's losslessness certificate."""
    from draftzoo.eval.certificate import describe
    from draftzoo.eval.machine_load import unreliable_sentence

    lines = [f"      {'drafter':28} {'T':>3} {'tau':>6} {'speedup':>9} {'greedy identity':>16}"]
    warnings = []
    for name, report in reports.items():
        warning = unreliable_sentence(report)
        if warning:
            warnings.append(f"      {name}: {warning}")
        for row in report["results"]:
            if row["batch_size"] != 1:
                continue
            same = row.get("greedy_identity")
            identity = f"{same['identical']}/{same['decodes']}" if same else "-"
            speedup = "busy" if warning else f"{row['speedup']['mean']:.2f}x"
            lines.append(
                f"      {name:28} {row['temperature']:>3g} {row['tau']:>6.2f} "
                f"{speedup:>9} {identity:>16}"
            )
    for name, report in reports.items():
        lines.append(f"      {name}: {describe(report['certificate'])}")
    return "\n".join(lines + warnings)


def run_demo(out: Path, steps: int, prompts: int) -> int:
    """Run the six steps; print what each measured."""
    from draftzoo.data.prompts import Prompt
    from draftzoo.eval.publish import publish
    from draftzoo.eval.runner import EvalConfig, evaluate, write_report
    from draftzoo.inference.load import load, load_drafter, load_target, resolve_drafter
    from draftzoo.inference.sampling import SamplingParams
    from draftzoo.train.registry import load_recipe, run_recipe

    recipe_file = recipes_dir() / "eagle3" / "testbed-small-demo.yaml"
    overrides = [f"output_dir={out / 'drafter'}", f"train.max_steps={steps}"]
    recipe = load_recipe(recipe_file, overrides)
    _say(1, f"prepare the training data: {recipe.data.source} (cached after the first run)")
    _prepare_data(recipe)

    _say(2, f"train: {recipe_file.name}, {steps} steps")
    result = run_recipe(recipe)
    print(f"      {result.train_seconds:.0f} s, final loss {result.final_loss:.3f}", flush=True)

    _say(3, f"eval: this drafter and the shipped {SHIPPED}, {prompts} HumanEval prompts")
    target, tokenizer = load_target(COMMITTED_TARGET)
    # a smaller certificate than `draftzoo eval` draws (4 x 4000 decodes), to keep the demo short
    config = EvalConfig(
        max_prompts=prompts, max_new_tokens=96, certificate_samples=1000, certificate_prompts=2
    )
    reports, report_path = {}, None
    for name, folder in (("this run", result.output_dir), (SHIPPED, resolve_drafter(SHIPPED)[0])):
        drafter = load_drafter(folder, target, tokenizer)
        reports[name] = evaluate(target, tokenizer, drafter, config, COMMITTED_TARGET)
        path = write_report(reports[name], out / ("eval" if name == "this run" else "eval-shipped"))
        report_path = report_path or path
    print(_side_by_side(reports), flush=True)

    _say(4, "publish this run's drafter to a local zoo")
    zoo = out / "zoo"
    # a local demo zoo: a busy machine's report is published too, its card saying so
    published = publish(
        result.output_dir, report_path, zoo, "eagle3-demo", True, allow_unreliable_timing=True
    )
    print(f"      {published} (card: {published / 'README.md'})", flush=True)

    _say(5, "load it back by name")
    generator = load("eagle3-demo", zoos=[zoo])
    _say(6, "generate")
    prompt = Prompt("demo", DEMO_PROMPT, "demo").render(generator.tokenizer, chat=True)
    output = generator.generate(prompt, SamplingParams(max_new_tokens=96))
    print(prompt + output.text)
    print(f"--- this generation: tau {output.metrics.mean_acceptance_length:.2f}")
    return 0
