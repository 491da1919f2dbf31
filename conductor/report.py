"""The report of every method's outcomes: `summarize` (accuracy per task and on average with its standard error
over repeats, worker tokens, calls, USD and steps per question, format validity, the workers chosen), then markdown,
a plot and results.json (`write_report`)."""

from __future__ import annotations

import collections
import json
import pathlib
from typing import Any, Mapping, Sequence

import numpy as np

from conductor.outcomes import Outcome


def _stderr(values: Sequence[float]) -> float | None:
    return float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else None


def summarize(outcomes: Sequence[Outcome], worker_names: Sequence[str]) -> dict[str, Any]:
    """The report of one method. Per task: the mean of every metric over questions and repeats, and
    `correct_stderr`, the standard error of the task's accuracy over repeats (None with one repeat). `average`:
    the unweighted mean of the task means, `correct_stderr` over repeats of that average. `workers_chosen`: the
    fraction of all steps run by each worker; `workers_chosen_by_task`: the same within each task."""
    if not outcomes:
        raise ValueError("no outcomes to summarize")
    by_task: dict[str, list[Outcome]] = collections.defaultdict(list)
    for outcome in outcomes:
        by_task[outcome.task_label].append(outcome)
    repeats = sorted({outcome.repeat for outcome in outcomes})
    names = sorted({name for outcome in outcomes for name in outcome.metrics})
    task_labels: dict[str, dict[str, Any]] = {}
    per_repeat_accuracy: dict[str, list[float]] = {}
    for task_label, rows in sorted(by_task.items()):
        task_labels[task_label] = {name: float(np.mean([row.metrics.get(name, 0.0) for row in rows])) for name in names}
        per_repeat_accuracy[task_label] = [
            float(np.mean([row.metrics["correct"] for row in rows if row.repeat == repeat])) for repeat in repeats
        ]
        task_labels[task_label]["correct_stderr"] = _stderr(per_repeat_accuracy[task_label])
        task_labels[task_label]["questions"] = len(rows) // len(repeats)
    average = {name: float(np.mean([task_labels[d][name] for d in task_labels])) for name in names}
    average_by_repeat = np.mean([per_repeat_accuracy[d] for d in task_labels], axis=0)
    average["correct_stderr"] = _stderr(list(average_by_repeat))

    def shares(rows: Sequence[Outcome]) -> dict[str, float]:
        counts = collections.Counter(worker for outcome in rows for worker in outcome.workers)
        total_steps = sum(counts.values())
        return {worker_names[w]: counts[w] / total_steps for w in range(len(worker_names)) if counts[w]}

    return {
        "questions": len({outcome.task_id for outcome in outcomes}),
        "repeats": len(repeats),
        "tasks": task_labels,
        "average": average,
        "average_accuracy": average["correct"],
        "average_accuracy_stderr": average["correct_stderr"],
        "workers_chosen": shares(outcomes),
        "workers_chosen_by_task": {task_label: shares(rows) for task_label, rows in sorted(by_task.items())},
    }


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def markdown_report(results: Mapping[str, Mapping[str, Any]], title: str) -> str:
    """Two tables: the averages with costs and workflow shape, then accuracy per task; then workers chosen."""
    task_labels = sorted({task_label for report in results.values() for task_label in report["tasks"]})
    lines = [
        f"# {title}",
        "",
        "Accuracy in %, ± standard error over repeats; worker tokens, USD, steps (one worker call each) and "
        "provider calls (calls the response cache did not answer) are per question; averages are unweighted over "
        "tasks.",
        "",
        "| method | accuracy | tokens | USD | steps | provider calls | valid format |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, report in results.items():
        average = report["average"]
        stderr = average["correct_stderr"]
        accuracy = _percent(average["correct"]) + ("" if stderr is None else f" ± {_percent(stderr)}")
        lines.append(
            f"| {method} | {accuracy} | {average.get('tokens', 0.0):.0f} | {average.get('cost_usd', 0.0):.5f} | "
            f"{average['steps']:.2f} | {average.get('worker_calls', 0.0):.2f} | {_percent(average['valid_format'])} |"
        )
    lines += ["", "| method | " + " | ".join(task_labels) + " |", "|---|" + "---|" * len(task_labels)]
    for method, report in results.items():
        cells = [_percent(report["tasks"][d]["correct"]) if d in report["tasks"] else "–" for d in task_labels]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "Workers chosen (share of all steps, %):", ""]

    def listed(shares: Mapping[str, float]) -> str:
        return ", ".join(f"{name} {_percent(share)}" for name, share in shares.items()) or "no steps"

    for method, report in results.items():
        lines.append(f"- {method}: {listed(report['workers_chosen'])}")
        by_task = report["workers_chosen_by_task"]
        if len({listed(shares) for shares in by_task.values()}) > 1:  # routing that differs between tasks
            lines += [f"  - {task_label}: {listed(shares)}" for task_label, shares in by_task.items()]
    return "\n".join(lines) + "\n"


def plot_accuracy_tokens(results: Mapping[str, Mapping[str, Any]], path: pathlib.Path, title: str) -> None:
    """Side-by-side horizontal bars per method: average accuracy (with standard error) and tokens per question."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    methods = list(results)
    accuracy = [100 * results[m]["average"]["correct"] for m in methods]
    errors = [100 * (results[m]["average"]["correct_stderr"] or 0.0) for m in methods]
    tokens = [results[m]["average"].get("tokens", 0.0) for m in methods]
    height = max(3.0, 0.4 * len(methods) + 1.5)
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(12, height), sharey=True)
    positions = np.arange(len(methods))
    left.barh(positions, accuracy, xerr=errors, color="tab:blue")
    left.set_xlabel("accuracy (%)")
    left.set_yticks(positions, methods)
    left.invert_yaxis()
    right.barh(positions, tokens, color="tab:orange")
    right.set_xlabel("worker tokens per question")
    left.set_xlim(0, 105)
    panels = ((left, accuracy, errors, "{:.1f}"), (right, tokens, [0.0] * len(tokens), "{:.0f}"))
    for axis, values, offsets, fmt in panels:
        for position, value, offset in zip(positions, values, offsets):
            axis.annotate(fmt.format(value), (value + offset, position), xytext=(3, 0), textcoords="offset points",
                          va="center", fontsize=8)  # fmt: skip
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


def write_report(results: Mapping[str, Mapping[str, Any]], out_dir: pathlib.Path, title: str) -> dict[str, str]:
    """results.json, results.md and accuracy_tokens.png under `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "results.json",
        "markdown": out_dir / "results.md",
        "plot": out_dir / "accuracy_tokens.png",
    }
    paths["json"].write_text(json.dumps({"title": title, "methods": results}, indent=2, sort_keys=False))
    paths["markdown"].write_text(markdown_report(results, title))
    plot_accuracy_tokens(results, paths["plot"], title)
    return {kind: str(path) for kind, path in paths.items()}
