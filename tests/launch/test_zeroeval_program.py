"""`python -m launch.zeroeval` on a small fake copy of ZeroEval's files: the accuracy table against the summaries,
the cost settings, the baselines and the report."""

from __future__ import annotations

import json

import numpy as np
import pytest
from absl import app, flags

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


def _run_summary(path, flag, value, seed, evaluation):
    path.mkdir(parents=True)
    record = {"flag": flag, "value": value, "seed": seed, "wall_s": 1.0, "command": [],
              "train_summary": {"eval": evaluation}}
    (path / "run_summary.json").write_text(json.dumps(record))
    return path / "run_summary.json"


REFERENCE = {
    "single": {"o1-mini-2024-09-12": {"accuracy": 0.90, "cost_usd_per_question": 0.004},
               "cheap": {"accuracy": 0.60, "cost_usd_per_question": 0.0001}},
    "per_task_best": {"route": "a: o1-mini-2024-09-12", "accuracy": 0.92, "cost_usd_per_question": 0.005},
    "oracle": {"accuracy": 0.97, "cost_usd_per_question": 0.0005},
    "task_routing_frontier": [{"accuracy": 0.60, "cost_usd_per_question": 0.0001},
                              {"accuracy": 0.92, "cost_usd_per_question": 0.005}],
}


def test_the_conductor_table_averages_seeds_per_penalty_and_counts_the_goals_met(tmp_path):
    paths = [
        _run_summary(tmp_path / "p0s1", "usd_penalty", "0", 1, {"accuracy": 0.917, "cost_usd_per_question": 0.004}),
        _run_summary(tmp_path / "p0s2", "usd_penalty", "0", 2, {"accuracy": 0.913, "cost_usd_per_question": 0.006}),
        _run_summary(tmp_path / "p9s1", "usd_penalty", "9.5", 1, {"accuracy": 0.895, "cost_usd_per_question": 0.002}),
        _run_summary(tmp_path / "p9s2", "usd_penalty", "9.5", 2, {"accuracy": 0.80, "cost_usd_per_question": 0.001}),
    ]
    table = program.conductor_table(program.conductor_runs(paths), REFERENCE)
    assert [row["usd_penalty"] for row in table] == [0.0, 9.5]
    zero, nine = table
    assert zero["seeds"] == [1, 2]
    assert zero["accuracy_mean"] == pytest.approx(0.915)
    assert zero["accuracy_sd"] == pytest.approx(np.std([0.917, 0.913], ddof=1))
    assert zero["cost_over_o1_mini"] == pytest.approx(1.25)
    # 0.917 is within 0.5 points of 0.92, 0.913 is not; neither costs <= half of o1-mini's 0.004
    assert zero["seeds_within_half_point_of_per_task_best"] == 1
    assert zero["seeds_within_1_point_of_o1_mini_at_half_its_cost"] == 0
    # 0.895 at 0.002 is within 1 point of 0.90 at exactly half the cost; 0.80 at 0.001 is 10 points below
    assert nine["seeds_within_1_point_of_o1_mini_at_half_its_cost"] == 1
    assert nine["cost_usd_per_question_mean"] == pytest.approx(0.0015)
    text = program.conductor_markdown(table, REFERENCE)
    assert "| 9.5 | 1, 2 | 84.75 ± 6.72 | 1.500 ± 0.707 | 0.375 | 0/2 | 1/2 |" in text


def test_conductor_runs_refuse_another_sweep_and_a_summary_without_the_zeroeval_evaluation(tmp_path):
    other = _run_summary(tmp_path / "lr", "learning_rate", "1e-4", 0, {"accuracy": 0.5, "cost_usd_per_question": 0.1})
    with pytest.raises(ValueError, match="not a run of a --usd_penalty sweep"):
        program.conductor_runs([other])
    synthetic = _run_summary(tmp_path / "syn", "usd_penalty", "1", 0, {"average_accuracy": 0.5})
    with pytest.raises(ValueError, match="no eval.accuracy and eval.cost_usd_per_question"):
        program.conductor_runs([synthetic])
    with pytest.raises(ValueError, match="matched no file"):
        program.report_conductor({}, [], tmp_path, tmp_path / "f.png")


def test_the_conductor_report_writes_its_table_and_a_png_of_the_frontier(tmp_path):
    path = _run_summary(tmp_path / "run", "usd_penalty", "0", 100, {"accuracy": 0.91, "cost_usd_per_question": 0.003})
    results = {"costs": {program.CONDUCTOR_SETTING: {"test": REFERENCE}},
               "router": {"points": [{"usd_weight": 0.0, "accuracy": 0.9, "cost_usd_per_question": 0.004}]}}
    text = program.report_conductor(results, program.conductor_runs([path]), tmp_path, tmp_path / "frontier.png")
    assert "| 0 | 100 | 91.00 ± 0.00 | 3.000 ± 0.000 | 0.750 | 0/1 | 0/1 |" in text
    assert (tmp_path / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    recorded = json.loads((tmp_path / "conductor.json").read_text())
    assert recorded["runs"] == [
        {"penalty": 0.0, "seed": 100, "accuracy": 0.91, "cost_usd_per_question": 0.003, "label": ""}]


def _labelled_sweeps(tmp_path):
    """Two recipes' sweeps at penalty 10, seeds 1 and 2, and the results.json they are reported against."""
    for recipe, accuracies in (("grpo", (0.70, 0.72)), ("dr_grpo", (0.93, 0.91))):
        for seed, accuracy in zip((1, 2), accuracies):
            _run_summary(tmp_path / recipe / f"seed={seed}", "usd_penalty", "10", seed,
                         {"accuracy": accuracy, "cost_usd_per_question": 0.001})
    results = {"costs": {program.CONDUCTOR_SETTING: {"test": REFERENCE}},
               "router": {"points": [{"usd_weight": 0.0, "accuracy": 0.9, "cost_usd_per_question": 0.004}]}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    return [f"{tmp_path / recipe}/seed=*/run_summary.json" for recipe in ("grpo", "dr_grpo")]


def _main(argv):
    try:
        program.parse_flags(["zeroeval", *argv])
        program.main([])
    finally:
        program.ZEROEVAL_FLAGS.unparse_flags()


def test_labelled_globs_get_rows_of_their_own_and_overlapping_globs_count_a_run_once(tmp_path, capsys):
    grpo, dr_grpo = _labelled_sweeps(tmp_path)
    _main([f"--results={tmp_path / 'results.json'}", f"--logdir={tmp_path / 'out'}", f"--plot={tmp_path / 'f.png'}",
           f"--conductor_runs={grpo},{dr_grpo},{tmp_path}/*/seed=1/run_summary.json",
           "--conductor_labels=GRPO,Dr. GRPO,again"])
    text = capsys.readouterr().out
    assert "| runs | --usd_penalty | seeds |" in text
    assert "| GRPO | 10 | 1, 2 | 71.00 ± 1.41 |" in text and "| Dr. GRPO | 10 | 1, 2 | 92.00 ± 1.41 |" in text
    assert "again" not in text  # its files were matched first by the labelled globs before it
    table = json.loads((tmp_path / "out" / "conductor.json").read_text())["table"]
    assert [(row["label"], row["seeds_within_half_point_of_per_task_best"]) for row in table] == [
        ("Dr. GRPO", 1), ("GRPO", 0)]
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_label_count_unlike_the_globs_is_a_usage_error(tmp_path):
    grpo, dr_grpo = _labelled_sweeps(tmp_path)
    with pytest.raises(app.UsageError, match="1 --conductor_labels for 2 --conductor_runs globs"):
        _main([f"--results={tmp_path / 'results.json'}", f"--logdir={tmp_path / 'out'}",
               f"--conductor_runs={grpo},{dr_grpo}", "--conductor_labels=GRPO"])
