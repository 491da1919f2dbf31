"""The learner suite's accelerator figure (a bf16 update of a Qwen2.5-1.5B-shaped model), run here on a shrunken
shape of the same config: the path a GPU or TPU takes, minus the size."""

import json

from launch.benchmarks import learner as learner_suite


def test_the_bf16_update_figure_runs_and_counts_its_tokens_and_model_flops():
    small = learner_suite.QWEN25_1_5B | {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
                                          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                          "head_dim": 16}  # fmt: skip
    report = learner_suite.accelerator_update(small, batch=4, prompt=16, completion=16, micro_batch=2, matmul_size=256)

    figures = report.figures
    (row,) = report.rows
    median_s, tokens_per_s, mfu = row[1], row[3], row[4]
    assert figures["batch"] == 4 and figures["micro_batch_size"] == 2
    assert tokens_per_s == 4 * 32 / median_s
    assert figures["flax_tokens_per_s"] == round(tokens_per_s, 1)
    expected_flops = learner_suite._update_flops(small, 4 * 32, 32, 4 * 16)
    assert figures["update_tflops"] == round(expected_flops / 1e12, 3)
    assert 0 < mfu < 1
    assert json.dumps(figures)  # the suite's JSON line must serialise
