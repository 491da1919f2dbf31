"""`python -m launch.zeroeval` on a small fake copy of ZeroEval's files: the accuracy table against the summaries,
the cost settings, the baselines and the report."""

from __future__ import annotations

import json

import numpy as np
import pytest
from absl import flags

from env.tasks import zeroeval as z
from launch import zeroeval as program

QUESTIONS = 8


def right(m: int, q: int) -> bool:
    return (m + q) % 4 != 0


def write_fake_copy(root):
    """Every model answers question q of every task right unless (model index + q) % 4 == 0."""
    for task in z.ZEROEVAL_TASKS:
        (root / task).mkdir(parents=True)
        rows = []
        for m, model in enumerate(z.ZEROEVAL_MODELS):
            records = []
            for q in range(QUESTIONS):
                gold = f"'s{q}'" if task == "crux" else str(q + 1)
                answer = gold if right(m, q) else ("'x'" if task == "crux" else "0")
                record = {"id": f"{task}-{q}", "chat_history": [f"ask {task} {q} " * 3],
                          "output": [json.dumps({"reasoning": "r" * (10 + q), "answer": answer})],
                          "answer": f"# {gold}" if task == "gsm" else gold,
                          ("problem" if task == "math-l5" else "question"): f"question {q} of {task}"}
                records.append(record)
            (root / task / f"{model}.json").write_text(json.dumps(records))
            name = "Llama-3.1-405B-Inst@hyperbolic" if "405B" in model else model
            accuracy = 100 * sum(right(m, q) for q in range(QUESTIONS)) / QUESTIONS
            rows.append({"Model": name, "Mode": "greedy", "Acc": f"{accuracy:.2f}"})
        (root / f"{task}.summary.json").write_text(json.dumps(rows))
    return root


def test_the_program_reports_the_published_table_costs_baselines_and_the_router(tmp_path):
    results = program.run(write_fake_copy(tmp_path / "zeroeval"), [1.0, 5.0], split_seed=0)
    assert len(results["accuracy"]) == 48
    for row in results["accuracy"]:
        assert 100 * row["project"] == pytest.approx(row["published"])
        assert row["zeroeval_rule_over_records"] == row["project"] and row["only_rule_right"] == 0
    assert set(results["costs"]) == {
        "cl100k_base, o1-mini output x1", "cl100k_base, o1-mini output x5", "chars/4, o1-mini output x1",
        "ZeroEval's verdicts, chars/4, o1-mini output x1",
    }
    plain = results["costs"]["cl100k_base, o1-mini output x1"]["all"]
    hidden = results["costs"]["cl100k_base, o1-mini output x5"]["all"]
    assert plain["questions"] == 3 * QUESTIONS
    o1, other = "o1-mini-2024-09-12", "gpt-4o-2024-08-06"
    assert hidden["single"][other] == plain["single"][other]
    output_tokens = next(r for r in results["tokens"] if r["model"] == o1)["cl100k_base_output"]
    extra = (hidden["single"][o1]["cost_usd_per_question"] - plain["single"][o1]["cost_usd_per_question"])
    assert extra == pytest.approx(4 * output_tokens * 12.0 / 1e6 / (3 * QUESTIONS))
    # each model misses a different quarter of the questions, so every question has a right model
    assert plain["oracle"]["accuracy"] == 1.0
    accuracies = [plain["single"][m]["accuracy"] for m in z.ZEROEVAL_MODELS]
    assert plain["best_single"]["accuracy"] == max(accuracies) == 0.75
    frontier_accuracies = [p["accuracy"] for p in plain["task_routing_frontier"]]
    assert frontier_accuracies == sorted(frontier_accuracies) and frontier_accuracies[-1] == 0.75
    test = results["costs"]["cl100k_base, o1-mini output x1"]["test"]
    assert test["questions"] == 3 * (QUESTIONS // 2)
    assert [p["usd_weight"] for p in results["router"]["points"]][0] == 0.0
    text = program.markdown(results)
    assert "| gsm | o1-mini-2024-09-12 | 75.00 | 75.00 | 75.0 | 0 | 0 | 8/8 |" in text
    assert "## Per-question router ceiling" in text
    assert np.isfinite(results["router"]["test_log_loss"])


def test_the_output_directory_is_logdir_and_the_old_out_dir_is_refused_with_its_new_name():
    try:
        assert program.parse_flags(["zeroeval", "--logdir=runs/z"]) == ["zeroeval"]
        assert program.ZEROEVAL_FLAGS["logdir"].value == "runs/z"
        with pytest.raises(flags.IllegalFlagValueError, match="--out_dir is renamed to --logdir"):
            program.parse_flags(["zeroeval", "--out_dir=runs/z"])
    finally:
        program.ZEROEVAL_FLAGS.unparse_flags()
