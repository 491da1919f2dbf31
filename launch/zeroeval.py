"""The zeroeval world's exact reference points, computed from its records (docs/zeroeval.md).

    python -m launch.zeroeval --logdir=runs/zeroeval

Prints, and writes as results.json and results.md under --logdir:
- per (task, model): accuracy under the project's graders, under ZeroEval's own rule (reproduced) and as ZeroEval
  published it, with the questions where the two rules disagree;
- tokens per model by each tokenizer (the chars/4 error against cl100k_base);
- per cost setting (tokenizer, o1-mini output factor) and split (all questions; the test split): every model alone,
  the best single model, the cheapest, each task to its best model, the per-question oracle, the exact frontier of
  routing by task label (all 16^3 assignments) and the cheapest task routing within 1 point of o1-mini alone;
- the supervised per-question router ceiling (`env.text_router`): trained on the train split with every model's
  recorded outcome, evaluated on the test split.

--results reads an earlier results.json instead of recomputing it. --conductor_runs adds the trained Conductors'
greedy test points (launch.compare's run_summary.json files of a --usd_penalty sweep):

    python -m launch.zeroeval --results=runs/zeroeval/results.json --logdir=runs/zeroeval \
        --conductor_runs='runs/frontier_sweep/*/seed=*/run_summary.json' --plot=docs/zeroeval-frontier.png

writing conductor.json and conductor.md (per penalty, over seeds, against o1-mini alone and the per-task best) and the
PNG. `--conductor_labels` names each glob's runs (an estimator, a recipe), which then get rows and a marker of their
own:

    python -m launch.zeroeval --results=runs/zeroeval/results.json --logdir=runs/zeroeval \
        --conductor_runs='runs/grpo_sweep/*/seed=*/run_summary.json,runs/dr_grpo_sweep/*/seed=*/run_summary.json' \
        --conductor_labels=GRPO,Dr. GRPO

The PNG shows each model alone, the task-routing frontier, the router ceiling and the Conductor's points, on the test
split with cl100k_base tokens and o1-mini's visible output (x1). --plot alone draws the reference points without runs.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import pathlib
from typing import Sequence

import numpy as np
from absl import app, flags

from env import frontier, text_router
from env.tasks import zeroeval
from env.workers.recorded import TOKENIZERS, ZEROEVAL_PRICES, RecordedWorker, count_tokens
from launch.flag_groups import renamed
from launch.flag_groups.own_flags import own_flags_parser

# Own FlagValues, as launch.data's: --data_dir and --logdir are also the launchers' flags, and a process that
# imports both (a test session) must not define them twice.
ZEROEVAL_FLAGS = flags.FlagValues()
_LOGDIR = flags.DEFINE_string(
    "logdir", "runs/zeroeval", "Where results.json and results.md go.", flag_values=ZEROEVAL_FLAGS
)
renamed.define_renamed("out_dir", "logdir", flag_values=ZEROEVAL_FLAGS)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "Data root holding zeroeval/ (default: the lookup order).", flag_values=ZEROEVAL_FLAGS
)
_O1_FACTORS = flags.DEFINE_list(
    "o1_mini_output_factors", ["1", "5"],
    "Multipliers of o1-mini's counted output tokens (its hidden reasoning is billed but not recorded); 1 counts only "
    "the visible text.",
    flag_values=ZEROEVAL_FLAGS,
)
_SPLIT_SEED = flags.DEFINE_integer(
    "split_seed", 0, "Seed of the train/test split (env.tasks.zeroeval).", flag_values=ZEROEVAL_FLAGS
)
_RESULTS = flags.DEFINE_string(
    "results", None, "An earlier run's results.json, read instead of computing the reference points again.",
    flag_values=ZEROEVAL_FLAGS,
)
_CONDUCTOR_RUNS = flags.DEFINE_list(
    "conductor_runs", [], "Globs of launch.compare run_summary.json files of zeroeval --usd_penalty runs.",
    flag_values=ZEROEVAL_FLAGS,
)
_CONDUCTOR_LABELS = flags.DEFINE_list(
    "conductor_labels", [], "A label per --conductor_runs glob, in order (none: the runs are one recipe's).",
    flag_values=ZEROEVAL_FLAGS,
)
_PLOT = flags.DEFINE_string(
    "plot", None, "Where the frontier PNG goes (with --conductor_runs, default <logdir>/frontier.png; without, the "
    "reference points alone).",
    flag_values=ZEROEVAL_FLAGS,
)
_O1_MINI = "o1-mini-2024-09-12"
# The setting the Conductor is trained and evaluated in (launch/configs/frontier.cfg).
CONDUCTOR_SETTING = "cl100k_base, o1-mini output x1"


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def _per_k(x: float) -> str:
    return f"{1000 * x:.3f}"


def accuracy_table(tasks, correct: np.ndarray, directory) -> tuple[list[dict], np.ndarray]:
    """Per (task, model): the project's grade (`correct[task, model]`), ZeroEval's rule, the published figure and the
    questions where the two disagree; and the matrix of ZeroEval's verdicts (a missing record: wrong)."""
    rows = []
    by_rule = np.zeros_like(correct)
    for task_label in zeroeval.ZEROEVAL_TASKS:
        published = zeroeval.published_accuracy(task_label, directory)
        mine = [q for q, t in enumerate(tasks) if t.task_label == task_label]
        for m, model in enumerate(zeroeval.ZEROEVAL_MODELS):
            project = rule = project_only = rule_only = 0
            recorded = [q for q in mine if model in tasks[q].metadata["records"]]
            for q in recorded:
                task = tasks[q]
                record = task.metadata["records"][model]
                by_project = bool(correct[q, m])
                right = zeroeval.zeroeval_grade(task_label, zeroeval.zeroeval_answer(record.output, model), task.gold)
                by_rule[q, m] = right
                project += by_project
                rule += right
                project_only += by_project and not right
                rule_only += right and not by_project
            rows.append({
                "task": task_label, "model": model, "questions": len(mine), "records": len(recorded),
                "project": project / len(mine), "zeroeval_rule_over_records": rule / len(recorded),
                "published": published.get(model), "only_project_right": project_only, "only_rule_right": rule_only,
            })
    return rows, by_rule


def token_table(tasks) -> list[dict]:
    rows = []
    for model in zeroeval.ZEROEVAL_MODELS:
        counts = {tokenizer: [0, 0] for tokenizer in TOKENIZERS}
        for task in tasks:
            record = task.metadata["records"].get(model)
            if record is None:
                continue
            for tokenizer in TOKENIZERS:
                counts[tokenizer][0] += count_tokens(record.prompt, tokenizer)
                counts[tokenizer][1] += count_tokens(record.output, tokenizer)
        rows.append({"model": model, **{f"{t}_{part}": counts[t][i] for t in TOKENIZERS
                                         for i, part in enumerate(("prompt", "output"))}})
    return rows


def reference_points(o: frontier.Outcomes) -> dict:
    singles = frontier.single_models(o)
    o1 = singles[o.models.index(_O1_MINI)]
    routes = frontier.task_routing_points(o)
    within = frontier.cheapest_within([p for _, p in routes], o1.accuracy - 0.01)
    return {
        "questions": int(len(o.task_label_of)),
        "single": {p.route: p.summary() for p in singles},
        "best_single": {"model": frontier.best_single(o).route, **frontier.best_single(o).summary()},
        "cheapest": {"model": frontier.cheapest_single(o).route, **frontier.cheapest_single(o).summary()},
        "per_task_best": {"route": frontier.per_task_best(o).route, **frontier.per_task_best(o).summary()},
        "oracle": frontier.oracle(o).summary(),
        "task_routing_within_1_point_of_o1_mini": {"route": within.route, **within.summary()},
        "task_routing_frontier": [{"route": p.route, **p.summary()} for p in frontier.task_routing_frontier(o)],
    }


def markdown(results: dict) -> str:
    lines = ["# zeroeval world: reference points", "", "## Accuracy per task and model (%)", "",
             "| task | model | project graders | ZeroEval rule (its records) | published | only project right | "
             "only rule right | records |", "|---|---|---|---|---|---|---|---|"]
    for r in results["accuracy"]:
        lines.append(f"| {r['task']} | {r['model']} | {_pct(r['project'])} | {_pct(r['zeroeval_rule_over_records'])} "
                     f"| {r['published']} | {r['only_project_right']} | {r['only_rule_right']} | "
                     f"{r['records']}/{r['questions']} |")
    lines += ["", "## Tokens per model, all questions (prompt / output)", "",
              "| model | cl100k_base | chars/4 | chars/4 ÷ cl100k (prompt, output) |", "|---|---|---|---|"]
    for r in results["tokens"]:
        lines.append(f"| {r['model']} | {r['cl100k_base_prompt']:,} / {r['cl100k_base_output']:,} | "
                     f"{r['chars/4_prompt']:,} / {r['chars/4_output']:,} | "
                     f"{r['chars/4_prompt'] / r['cl100k_base_prompt']:.3f}, "
                     f"{r['chars/4_output'] / r['cl100k_base_output']:.3f} |")
    for setting, by_split in results["costs"].items():
        for split, points in by_split.items():
            lines += ["", f"## {setting}, {split} split ({points['questions']} questions): accuracy %, $ per 1,000 "
                      "questions", "", "| route | accuracy | $/1k q |", "|---|---|---|"]
            for name, p in points["single"].items():
                lines.append(f"| {name} | {_pct(p['accuracy'])} | {_per_k(p['cost_usd_per_question'])} |")
            for key in ("best_single", "cheapest", "per_task_best", "oracle", "task_routing_within_1_point_of_o1_mini"):
                p = points[key]
                label = p.get("model") or p.get("route") or ""
                lines.append(f"| **{key}** {label} | {_pct(p['accuracy'])} | {_per_k(p['cost_usd_per_question'])} |")
            lines += ["", "Task-routing frontier:", ""]
            for p in points["task_routing_frontier"]:
                lines.append(f"- {_pct(p['accuracy'])}% at ${_per_k(p['cost_usd_per_question'])}/1k: {p['route']}")
    router = results["router"]
    lines += ["", f"## Per-question router ceiling ({router['about']})", "", "| usd weight λ | accuracy | $/1k q |",
              "|---|---|---|"]
    for p in router["points"]:
        lines.append(f"| {p['usd_weight']:g} | {_pct(p['accuracy'])} | {_per_k(p['cost_usd_per_question'])} |")
    return "\n".join(lines) + "\n"


def run(directory: pathlib.Path, factors: Sequence[float], split_seed: int) -> dict:
    tasks = [t for task_label in zeroeval.ZEROEVAL_TASKS for t in zeroeval.load_zeroeval(task_label, directory)]
    test = np.zeros(len(tasks), dtype=bool)
    for task_label in zeroeval.ZEROEVAL_TASKS:
        ids = {f"zeroeval/{task_label}/{i}" for i in zeroeval.split_indices(
            task_label, sum(t.task_label == task_label for t in tasks), "test", split_seed)}
        test |= np.array([t.id in ids for t in tasks])
    results = {"costs": {}}
    correct = None
    for tokenizer in TOKENIZERS:
        for factor in factors if tokenizer == "cl100k_base" else (1.0,):
            workers = [RecordedWorker(m, ZEROEVAL_PRICES[m], tokenizer=tokenizer,
                                      output_factor=factor if m == _O1_MINI else 1.0)
                       for m in zeroeval.ZEROEVAL_MODELS]
            o = frontier.outcomes(tasks, workers, correct)
            correct = o.correct
            results["costs"][f"{tokenizer}, o1-mini output x{factor:g}"] = {
                "all": reference_points(o), "test": reference_points(o.subset(np.flatnonzero(test)))}
            if tokenizer == "cl100k_base" and factor == factors[0]:
                results["router"] = text_router.ceiling(tasks, o, test)
    results["accuracy"], by_rule = accuracy_table(tasks, correct, directory)
    # The "for scale" figures: ZeroEval's verdicts, chars/4 tokens, o1-mini's visible output only.
    chars4 = frontier.outcomes(
        tasks, [RecordedWorker(m, ZEROEVAL_PRICES[m], tokenizer="chars/4") for m in zeroeval.ZEROEVAL_MODELS], correct
    )
    results["costs"]["ZeroEval's verdicts, chars/4, o1-mini output x1"] = {
        "all": reference_points(dataclasses.replace(chars4, correct=by_rule))
    }
    results["tokens"] = token_table(tasks)
    return results


@dataclasses.dataclass(frozen=True)
class ConductorRun:
    """One trained Conductor's greedy point on the test split; `penalty` is its --usd_penalty, `label` its recipe's
    name where runs of several are compared."""

    penalty: float
    seed: int
    accuracy: float
    cost_usd_per_question: float
    label: str = ""


def conductor_runs(paths: Sequence[pathlib.Path], label: str = "") -> list[ConductorRun]:
    """Runs recorded as launch.compare records them (run_summary.json: flag, value, seed and train_summary, whose
    eval holds the zeroeval evaluation's accuracy and cost_usd_per_question)."""
    runs = []
    for path in paths:
        record = json.loads(pathlib.Path(path).read_text())
        if record.get("flag") != "usd_penalty":
            raise ValueError(f"{path}: not a run of a --usd_penalty sweep (its flag is {record.get('flag')!r})")
        evaluation = record.get("train_summary", {}).get("eval", {})
        if "accuracy" not in evaluation or "cost_usd_per_question" not in evaluation:
            raise ValueError(f"{path}: its summary has no eval.accuracy and eval.cost_usd_per_question, which "
                             "launch.train writes on the zeroeval world with --eval_tasks")
        runs.append(ConductorRun(float(record["value"]), int(record["seed"]), float(evaluation["accuracy"]),
                                 float(evaluation["cost_usd_per_question"]), label))
    return runs


def _sd(values: np.ndarray) -> float:
    return float(values.std(ddof=1)) if len(values) > 1 else 0.0


def conductor_table(runs: Sequence[ConductorRun], reference: dict) -> list[dict]:
    """Per label and penalty, over its seeds: mean and sample standard deviation of accuracy and cost, the mean cost
    as a fraction of o1-mini alone's, and how many seeds meet each goal of the issue: accuracy at least the per-task
    best routing's minus 0.5 points; within 1 point of o1-mini alone at no more than half its cost."""
    o1 = reference["single"][_O1_MINI]
    best = reference["per_task_best"]["accuracy"]
    rows = []
    for label, penalty in sorted({(run.label, run.penalty) for run in runs}):
        mine = [run for run in runs if (run.label, run.penalty) == (label, penalty)]
        accuracy = np.array([run.accuracy for run in mine])
        cost = np.array([run.cost_usd_per_question for run in mine])
        cheap_and_close = (accuracy >= o1["accuracy"] - 0.01) & (cost <= 0.5 * o1["cost_usd_per_question"])
        rows.append({
            "label": label, "usd_penalty": penalty, "seeds": sorted(run.seed for run in mine),
            "accuracy_mean": float(accuracy.mean()), "accuracy_sd": _sd(accuracy),
            "cost_usd_per_question_mean": float(cost.mean()), "cost_usd_per_question_sd": _sd(cost),
            "cost_over_o1_mini": float(cost.mean() / o1["cost_usd_per_question"]),
            "seeds_within_half_point_of_per_task_best": int((accuracy >= best - 0.005).sum()),
            "seeds_within_1_point_of_o1_mini_at_half_its_cost": int(cheap_and_close.sum()),
        })
    return rows


def conductor_markdown(table: Sequence[dict], reference: dict) -> str:
    o1 = reference["single"][_O1_MINI]
    best = reference["per_task_best"]
    labelled = any(row["label"] for row in table)
    lines = [f"# The Conductor on the zeroeval test split ({CONDUCTOR_SETTING})", "",
             f"o1-mini alone {_pct(o1['accuracy'])}% at ${_per_k(o1['cost_usd_per_question'])}/1k; per-task best "
             f"{_pct(best['accuracy'])}% at ${_per_k(best['cost_usd_per_question'])}/1k ({best['route']}).", "",
             "| " + "runs | " * labelled + "--usd_penalty | seeds | accuracy % (mean ± sd) | $/1k q (mean ± sd) | "
             "cost ÷ o1-mini | >= per-task best - 0.5 | within 1 point of o1-mini at <= 50% cost |",
             "|---" * (7 + labelled) + "|"]
    for row in table:
        seeds = len(row["seeds"])
        lines.append(
            "| " + f"{row['label']} | " * labelled + f"{row['usd_penalty']:g} | {', '.join(map(str, row['seeds']))} | "
            f"{_pct(row['accuracy_mean'])} ± "
            f"{_pct(row['accuracy_sd'])} | {_per_k(row['cost_usd_per_question_mean'])} ± "
            f"{_per_k(row['cost_usd_per_question_sd'])} | {row['cost_over_o1_mini']:.3f} | "
            f"{row['seeds_within_half_point_of_per_task_best']}/{seeds} | "
            f"{row['seeds_within_1_point_of_o1_mini_at_half_its_cost']}/{seeds} |")
    return "\n".join(lines) + "\n"


def frontier_figure(reference: dict, router: Sequence[dict], runs: Sequence[ConductorRun],
                    path: pathlib.Path) -> None:
    """Accuracy against $ per 1,000 questions (log scale): each model alone, the exact task-routing frontier, the
    text router's ceiling, the per-question oracle, the goal's region (within 1 point of o1-mini at no more than half
    its cost) and each Conductor run, coloured by its --usd_penalty and shaped by its label, with the mean over its
    seeds as a large marker."""
    import matplotlib  # only this mode draws; the rest of the program runs without a display

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def xy(points):
        return [1000 * p["cost_usd_per_question"] for p in points], [100 * p["accuracy"] for p in points]

    figure, axes = plt.subplots(figsize=(9, 6))
    axes.set_xscale("log")
    axes.step(*xy(reference["task_routing_frontier"]), where="post", color="black",
              label="routing by task label (exact frontier)")
    for name, point in reference["single"].items():
        (x,), (y,) = xy([point])
        axes.scatter(x, y, marker="s", s=16, color="grey")
        axes.annotate(name.split("-2024")[0].split("-Instruct")[0], (x, y), fontsize=6, color="dimgrey",
                      xytext=(3, -3), textcoords="offset points")
    axes.plot(*xy(router), ":", marker=".", color="tab:purple", label="supervised text router (per-question ceiling)")
    axes.scatter(*xy([reference["oracle"]]), marker="D", s=24, color="tab:green",
                 label="per-question oracle (cheapest right answer)")
    o1 = reference["single"][_O1_MINI]
    left = 0.5 * min(x for x in xy(reference["single"].values())[0])
    axes.add_patch(plt.Rectangle((left, 100 * o1["accuracy"] - 1), 500 * o1["cost_usd_per_question"] - left,
                                 101 - 100 * o1["accuracy"], color="tab:green", alpha=0.15,
                                 label="goal: within 1 point of o1-mini at <= 50% of its cost"))
    penalties = sorted({run.penalty for run in runs})
    labels = sorted({run.label for run in runs})
    colours = plt.get_cmap("plasma")
    for label, penalty in sorted({(run.label, run.penalty) for run in runs}):
        mine = [vars(run) for run in runs if (run.label, run.penalty) == (label, penalty)]
        colour = colours(0.85 * penalties.index(penalty) / max(len(penalties) - 1, 1))
        marker = "*PXov^"[labels.index(label) % 6]
        axes.scatter(*xy(mine), s=16, alpha=0.6, color=colour, marker=marker)
        (x,), (y,) = xy([{key: np.mean([run[key] for run in mine]) for key in ("accuracy", "cost_usd_per_question")}])
        axes.scatter(x, y, s=110, marker=marker, color=colour, edgecolors="black",
                     label=f"Conductor{', ' + label if label else ''}, --usd_penalty={penalty:g} "
                           f"({len(mine)} seed{'s' * (len(mine) > 1)})")
    axes.set_xlim(left=left)
    axes.set_ylim(50, 100)
    axes.set_xlabel("$ per 1,000 test questions (cl100k_base tokens x list prices; o1-mini's visible output only)")
    axes.set_ylabel("accuracy on the test split (%)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=130)
    plt.close(figure)


def report_conductor(results: dict, runs: Sequence[ConductorRun], out: pathlib.Path, plot: pathlib.Path) -> str:
    """conductor.json, conductor.md and the PNG from `results` (this program's) and the Conductor's `runs`."""
    if not runs:
        raise ValueError("--conductor_runs matched no file")
    reference = results["costs"][CONDUCTOR_SETTING]["test"]
    table = conductor_table(runs, reference)
    (out / "conductor.json").write_text(json.dumps({"runs": [vars(run) for run in runs], "table": table}, indent=1))
    text = conductor_markdown(table, reference)
    (out / "conductor.md").write_text(text)
    frontier_figure(reference, results["router"]["points"], runs, plot)
    return text


def main(argv: list[str]) -> None:
    del argv
    factors = [float(f) for f in _O1_FACTORS.value]
    if not factors or any(f < 1 for f in factors):
        raise app.UsageError(f"--o1_mini_output_factors must be numbers >= 1, got {_O1_FACTORS.value}")
    if _CONDUCTOR_LABELS.value and len(_CONDUCTOR_LABELS.value) != len(_CONDUCTOR_RUNS.value):
        raise app.UsageError(f"{len(_CONDUCTOR_LABELS.value)} --conductor_labels for {len(_CONDUCTOR_RUNS.value)} "
                             "--conductor_runs globs: give one label per glob, or none")
    out = pathlib.Path(_LOGDIR.value)
    out.mkdir(parents=True, exist_ok=True)
    if _RESULTS.value:
        results = json.loads(pathlib.Path(_RESULTS.value).read_text())
    else:
        results = run(zeroeval.data_dir(_DATA_DIR.value), factors, _SPLIT_SEED.value)
        (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        text = markdown(results)
        (out / "results.md").write_text(text)
        print(text)
    if _CONDUCTOR_RUNS.value:
        labels = _CONDUCTOR_LABELS.value or [""] * len(_CONDUCTOR_RUNS.value)
        label_of: dict[str, str] = {}  # a file two globs match counts once, under the first one's label
        for pattern, label in zip(_CONDUCTOR_RUNS.value, labels):
            for path in sorted(glob.glob(pattern)):
                label_of.setdefault(path, label)
        try:
            runs = [run for path, label in label_of.items() for run in conductor_runs([pathlib.Path(path)], label)]
            print(report_conductor(results, runs, out, pathlib.Path(_PLOT.value or out / "frontier.png")))
        except ValueError as error:
            raise app.UsageError(str(error)) from error
    elif _PLOT.value:
        frontier_figure(results["costs"][CONDUCTOR_SETTING]["test"], results["router"]["points"], [],
                        pathlib.Path(_PLOT.value))


parse_flags = own_flags_parser(ZEROEVAL_FLAGS, __doc__)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
