"""What each run of `scripts/train_variants.sh` reached: a line per run, then its greedy routes per task.

    python scripts/train_variants_report.py OUT_DIR

Per run (OUT_DIR/NAME with its console OUT_DIR/NAME.log): GRPO iterations finished, the median iteration time, the
mean reward of the first and last fifth of the iterations, and, where the run ended and printed its summary, the
greedy score on `--eval_tasks` with each task's accuracy and its most chosen worker's share.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

from rl.metrics import first_and_last_fifth, read_metrics


def final_summary(console: pathlib.Path) -> dict | None:
    """launch.train's last stdout line, a JSON summary, or None where the run did not get there."""
    for line in reversed(console.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def main(out: pathlib.Path) -> None:
    for console in sorted(out.glob("*.log")):
        run = console.with_suffix("")
        records = read_metrics(run) if (run / "metrics.jsonl").exists() else []
        line = f"{run.name:28} iterations {len(records):4d}"
        if records:
            first, last = first_and_last_fifth([record["reward/mean"] for record in records])
            seconds = np.median([record["time/iteration"] for record in records])
            line += f"  s/iteration {seconds:6.2f}  reward {first:.3f} -> {last:.3f}"
        summary = final_summary(console)
        if summary is None or "eval" not in summary:
            print(line + "  (no greedy evaluation)")
            continue
        evaluation = summary["eval"]
        print(line + f"  greedy {100 * evaluation['average_accuracy']:.2f}")
        for task, scores in sorted(evaluation["tasks"].items()):
            chosen = evaluation["workers_chosen_by_task"].get(task, {})
            total = sum(chosen.values()) or 1
            top = max(chosen, key=chosen.get) if chosen else "-"
            print(f"    {task:14} {100 * scores['correct']:6.2f}  {top} {chosen.get(top, 0) / total:.2f}")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
