"""`--suite=gpu` on a machine without a GPU: the one-line answer, and the pieces of the GPU run that a CPU can run (the
quickstart's phase split from its metrics, the time box, the MFU's FLOP count, the weight sync, the report)."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from launch.benchmark_suites import common, gpu, profile
from launch.benchmark_suites import learner as learner_suite
from launch.benchmark_suites import sync as sync_suite
from models import hf_io
from models.config import ModelConfig
from models.transformer import Transformer
from rl.metrics import MetricsWriter, read_metrics
from rollout.torch_generator import TorchGenerator

REPO = pathlib.Path(__file__).resolve().parents[2]
SMALL_QWEN2 = learner_suite.QWEN25_1_5B | {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
                                           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                           "head_dim": 16}  # fmt: skip
CPU_ONLY = {"jax_backend": "cpu", "jax_devices": ["cpu:0"], "torch_cuda_available": False}


def test_without_a_gpu_the_suite_says_what_it_found_in_one_line_and_exits_0():
    environment = {**os.environ, "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-m", "launch.benchmark", "--suite=gpu"], cwd=REPO, env=environment,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    devices = [str(device) for device in jax.devices("cpu")]
    lines = result.stdout.splitlines()
    (line,) = [line for line in lines if line.startswith("no CUDA GPU for --suite=gpu")]
    assert f"jax.devices() = {devices}" in line and "torch.cuda.is_available() = False" in line
    figures = json.loads(lines[-1])
    assert figures["suite"] == "gpu" and figures["gpu"] is None
    assert figures["devices"] == {"jax_backend": "cpu", "jax_devices": devices, "torch_cuda_available": False}


@pytest.mark.parametrize(
    "found, missing",
    [
        (CPU_ONLY, True),
        ({"jax_backend": "gpu", "jax_devices": ["cuda:0"], "torch_cuda_available": False}, True),
        ({**CPU_ONLY, "torch_cuda_available": True, "torch_cuda_device": "NVIDIA H100 80GB HBM3"}, True),
        ({"jax_backend": "gpu", "jax_devices": ["cuda:0"], "torch_cuda_available": True}, False),
        ({"jax_backend": "cuda", "jax_devices": ["cuda:0"], "torch_cuda_available": True}, False),
    ],
)
def test_the_suite_runs_only_where_jax_and_torch_both_see_a_cuda_gpu(found, missing):
    line = gpu.missing_gpu(found)
    assert (line is not None) == missing
    if missing:
        assert f"jax.devices() = {found['jax_devices']}" in line
        assert f"torch.cuda.is_available() = {found['torch_cuda_available']}" in line


def test_the_quickstart_config_plans_the_iterations_the_summary_counts_against(tmp_path):
    assert gpu.flagfile_value(REPO / gpu.QUICKSTART_CONFIG, "iterations") == "25"
    flagfile = tmp_path / "run.cfg"
    flagfile.write_text("# --iterations=1 in a comment\n--iterations=3\n--iterations_extra=9\n--iterations=7\n")
    assert gpu.flagfile_value(flagfile, "iterations") == "7"
    assert gpu.flagfile_value(flagfile, "lr") is None


# Five iterations: seconds of each phase and of the iteration, and the mean reward. The phases need not add up to the
# iteration (advantages, logging and checkpoints are in neither).
ITERATIONS = [
    # iteration, generate, score, learn, sync, reward
    (10.0, 2.0, 1.0, 6.0, 1.0, 0.70),  # the first: compiles
    (4.0, 2.0, 0.5, 1.0, 0.5, 0.75),
    (5.0, 2.5, 0.5, 1.5, 0.5, 0.80),
    (6.0, 3.0, 1.0, 1.5, 0.5, 0.85),
    (4.5, 2.0, 0.5, 1.5, 0.5, 0.90),
]


def test_the_phase_split_and_reward_fifths_come_from_the_runs_metrics(tmp_path):
    writer = MetricsWriter(tmp_path)
    for step, (iteration, generate, score, learn, sync, reward) in enumerate(ITERATIONS, start=1):
        writer.log(step, {"time/iteration": iteration, "time/generate": generate, "time/score": score,
                          "time/learn": learn, "time/sync": sync, "reward/mean": reward})  # fmt: skip
    writer.close()

    summary = gpu.summarize_quickstart(read_metrics(tmp_path), planned_iterations=25)

    assert summary["iterations"] == 5 and summary["iterations_planned"] == 25 and not summary["finished"]
    assert summary["first_iteration_s"] == 10.0
    # After the first: iteration times 4, 5, 6, 4.5 have the median 4.75; generate 2, 2.5, 3, 2 the median 2.25.
    assert summary["seconds_per_iteration"] == 4.75
    assert summary["generate_share"] == pytest.approx(2.25 / 4.75)
    assert summary["score_share"] == pytest.approx(0.5 / 4.75)
    assert summary["learn_share"] == pytest.approx(1.5 / 4.75)
    assert summary["sync_share"] == pytest.approx(0.5 / 4.75)
    assert summary["learn_sync_share"] == pytest.approx(2.0 / 4.75)
    # The whole run, the first iteration included: 29.5 s of iterations.
    assert summary["generate_share_of_run"] == pytest.approx(11.5 / 29.5)
    assert summary["score_share_of_run"] == pytest.approx(3.5 / 29.5)
    assert summary["learn_share_of_run"] == pytest.approx(11.5 / 29.5)
    assert summary["sync_share_of_run"] == pytest.approx(3.0 / 29.5)
    # A fifth of five iterations is one.
    assert summary["reward_first_fifth"] == 0.70 and summary["reward_last_fifth"] == 0.90

    assert gpu.summarize_quickstart(read_metrics(tmp_path), planned_iterations=5)["finished"]
    assert gpu.summarize_quickstart([], planned_iterations=25) == {
        "iterations": 0, "iterations_planned": 25, "finished": False}  # fmt: skip


def test_a_quickstart_stopped_at_its_time_box_reports_the_stop_and_the_iterations_it_finished():
    summary = gpu.quickstart(time_box_s=1.0)  # the training process is still importing its modules then

    assert summary["exit_code"] is None and summary["time_box_s"] == 1.0
    assert summary["iterations"] == 0 and summary["iterations_planned"] == 25 and not summary["finished"]
    assert 1.0 <= summary["wall_s"] < 60


def test_the_learner_parts_update_flops_match_a_hand_count_and_the_h200_figures():
    # Qwen2.5-1.5B, 8 sequences of 512 prompt + 512 completion tokens. Per layer, the matmul weights:
    # q and o 1536 x 1536 each, k and v 1536 x 256 each, gate, up and down 1536 x 8960 each.
    per_layer = 2 * 1536 * 1536 + 2 * 1536 * 256 + 3 * 1536 * 8960
    assert per_layer == 46_792_704
    tokens = 8 * 1024
    matmuls = 6 * 28 * per_layer * tokens  # forward 2, backward 4 FLOPs per weight and token
    head = 6 * 1536 * 151_936 * 8 * 512  # the tied LM head, on the completion positions only
    attention = 3 * 28 * 8 * 2 * (2 * 1024 * 1024 * 1536)  # QK^T and PV, forward and backward (3x)
    flops = learner_suite._update_flops(learner_suite.QWEN25_1_5B, tokens, 1024, 8 * 512)
    assert flops == matmuls + head + attention == 74_463_458_623_488  # 74.46 TFLOP
    # The H200 run of 2026-11-26: 0.298 s per update, MFU 0.479 against the 521.6 TFLOP/s its one-matmul-per-call
    # peak measured (docs/log/2026-11-26-h200.md).
    assert flops / 0.298 / 1e12 == pytest.approx(249.9, abs=0.05)
    assert flops / 0.298 / 521.6e12 == pytest.approx(0.479, abs=0.0005)


def test_the_learner_part_reports_the_accelerator_updates_figures():
    accelerator = learner_suite.accelerator_update(SMALL_QWEN2, batch=4, prompt=16, completion=16, micro_batch=2,
                                                   matmul_size=128)  # fmt: skip
    figures = gpu.learner_figures(accelerator)

    (row,) = accelerator.rows
    assert figures["median_s"] == row[1] and figures["min_s"] == row[2] and figures["note"] == accelerator.notes[0]
    assert figures["flax_mfu"] == round(row[4], 4) and figures["batch"] == 4 and "model_shape" not in figures
    rows = {(part, figure): value for part, figure, value in gpu.report({}, {"learner": figures}, 1.0).rows}
    assert rows[("learner", "MFU (vs measured bf16 matmul)")] == figures["flax_mfu"]
    assert rows[("learner", "tokens/s")] == figures["flax_tokens_per_s"] == round(4 * 32 / row[1], 1)


def test_the_learner_part_traces_one_more_update_and_reports_its_kernels(tmp_path):
    accelerator = learner_suite.accelerator_update(SMALL_QWEN2, batch=4, prompt=16, completion=16, micro_batch=2,
                                                   matmul_size=128, profile_dir=str(tmp_path))  # fmt: skip

    kernels = accelerator.figures["kernels"]
    assert list(tmp_path.rglob("*.xplane.pb"))
    assert kernels["calls_traced"] == 1 and kernels["kernel_seconds"] > 0 and kernels["launches"] >= kernels["kernels"]
    assert sum(kind["share"] for kind in kernels["by_kind"].values()) == pytest.approx(1.0)
    assert sum(kind["seconds"] for kind in kernels["by_kind"].values()) == pytest.approx(kernels["kernel_seconds"])
    shares = [kernel["share"] for kernel in kernels["top"]]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-9


def test_learner_options_report_each_option_a_failure_and_what_the_time_box_left_out(monkeypatch):
    calls, accelerator_update = [], learner_suite.accelerator_update

    def update(hf_config, **settings):
        calls.append(settings)
        if settings.get("attention_implementation") == "cudnn":
            raise RuntimeError("cuDNN fused attention needs an NVIDIA GPU")
        return accelerator_update(SMALL_QWEN2, **(settings | {"prompt": 8, "completion": 8, "matmul_size": 64}))

    options = ({"attention_implementation": "cudnn"}, {"micro_batch": 2}, {"micro_batch": 4})
    monkeypatch.setattr(learner_suite, "accelerator_update", update)
    monkeypatch.setattr(gpu, "LEARNER_OPTIONS", options)
    figures = gpu.learner_options(time_box_s=10_000)

    names = [",".join(f"{key}={value}" for key, value in option.items()) for option in options]
    assert list(figures) == names == ["attention_implementation=cudnn", "micro_batch=2", "micro_batch=4"]
    assert figures[names[0]] == {"error": "RuntimeError: cuDNN fused attention needs an NVIDIA GPU"}
    assert figures[names[1]]["micro_batch_size"] == 2 and figures[names[2]]["micro_batch_size"] == 4
    assert figures[names[1]]["attention_implementation"] == "auto" and not figures[names[1]]["fused_attention"]
    assert [call["micro_batch"] for call in calls] == [learner_suite.ACCELERATOR_SHAPE["micro_batch"], 2, 4]

    skipped = gpu.learner_options(time_box_s=gpu.LEARNER_OPTION_S - 1)
    assert all(option["skipped"].startswith(f"under {gpu.LEARNER_OPTION_S} s") for option in skipped.values())


def test_the_in_process_sync_cast_to_bfloat16_lands_the_learners_weights_in_the_generator():
    model = Transformer(ModelConfig.from_hf(SMALL_QWEN2, param_dtype="float32"), rngs=nnx.Rngs(0))
    hf_model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**SMALL_QWEN2), dtype=torch.bfloat16
    )
    generator = TorchGenerator(hf_model, dtype=torch.bfloat16)

    sync_s, memcpy_s, total_bytes = sync_suite.in_process_seconds(model, generator, dtype=jnp.bfloat16, repeats=2)

    assert len(sync_s) == len(memcpy_s) == 2 and min(sync_s + memcpy_s) > 0
    assert total_bytes == 2 * sum(p.numel() for p in hf_model.parameters())
    assert generator.policy_version == 3  # one untimed sync, then two
    expected = hf_io.to_hf_tensors(model)
    received = dict(generator.model.named_parameters())
    assert set(received) <= set(expected)
    for name, parameter in received.items():
        cast = np.asarray(jnp.asarray(expected[name]).astype(jnp.bfloat16).astype(jnp.float32))
        np.testing.assert_array_equal(parameter.float().numpy(), cast, err_msg=name)


def test_the_sync_part_measures_each_dtype_against_a_copy_of_its_bytes():
    parameters = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**SMALL_QWEN2)).parameters())  # fmt: skip

    figures = gpu.weight_sync(SMALL_QWEN2, device="cpu", repeats=1)

    assert figures["bfloat16"]["bytes"] == 2 * parameters and figures["float32"]["bytes"] == 4 * parameters
    for dtype in gpu.SYNC_DTYPES:
        assert figures[dtype]["sync_over_memcpy"] == figures[dtype]["sync_s"] / figures[dtype]["memcpy_s"]


def test_the_report_has_a_row_per_figure_and_the_json_line_holds_every_part(capsys):
    found = {"jax_backend": "gpu", "jax_devices": ["cuda:0"], "torch_cuda_available": True,
             "torch_cuda_device": "NVIDIA H100 80GB HBM3"}  # fmt: skip
    quickstart = {"iterations": 2, "iterations_planned": 25, "exit_code": None, "time_box_s": 240.0, "wall_s": 240.2,
                  "first_iteration_s": 10.0, "seconds_per_iteration": 4.0, "reward_first_fifth": 0.7,
                  "reward_last_fifth": 0.75}  # fmt: skip
    quickstart |= {f"{phase}_share": 0.25 for phase in gpu.PHASES}
    quickstart |= {f"{phase}_share_of_run": 0.2 for phase in gpu.PHASES}
    quickstart["learn_sync_share"] = 0.5
    learner = {"median_s": 0.298, "flax_tokens_per_s": 27492.0, "flax_mfu": 0.3125, "bf16_matmul_tflops_per_s": 790.0,
               "note": "the learner's note",
               "kernels": {"by_kind": {"matmul": {"seconds": 0.2, "share": 0.625},
                                       "fusion or other": {"seconds": 0.12, "share": 0.375}}}}  # fmt: skip
    options = {"attention_implementation=einsum": {"median_s": 0.25, "flax_mfu": 0.372},
               "micro_batch=8": {"error": "XlaRuntimeError: RESOURCE_EXHAUSTED"},
               "attention_implementation=cudnn,micro_batch=8": {"skipped": "under 100 s of the 300 s time box left"},
               "part_s": 90.0}  # fmt: skip
    parts = {"quickstart": quickstart, "learner": learner, "sync": {"error": "RuntimeError: CUDA out of memory"},
             "learner_options": options}

    report = gpu.report(found, parts, suite_s=300.0)
    common.emit(report)

    rows = {(part, figure): value for part, figure, value in report.rows}
    assert rows[("quickstart", "iterations")] == "2 of 25 (stopped at its 240 s time box)"
    assert rows[("quickstart", "reward: first fifth -> last fifth")] == "0.700 -> 0.750"
    assert rows[("quickstart", "learn share: median / of the run")] == "0.250 / 0.200"
    assert rows[("quickstart", "learn + sync share, median (e2e goal <= 35%)")] == 0.5
    assert rows[("learner", "MFU (vs measured bf16 matmul)")] == 0.3125
    assert rows[("learner", "kernel time share: matmul")] == "0.625"
    assert rows[("learner", "kernel time share: fusion or other")] == "0.375"
    assert rows[("sync", "FAILED")] == "RuntimeError: CUDA out of memory"
    assert rows[("learner_options", "attention_implementation=einsum: update s (median) / MFU")] == "0.2500 / 0.372"
    assert rows[("learner_options", "micro_batch=8")] == "XlaRuntimeError: RESOURCE_EXHAUSTED"
    assert rows[("learner_options", "attention_implementation=cudnn,micro_batch=8")].startswith("under 100 s")
    lines = capsys.readouterr().out.splitlines()
    assert "the learner's note" in lines and "suite: 300 s (goal < 480 s)" in lines
    figures = json.loads(lines[-1])
    assert figures["gpu"] == "NVIDIA H100 80GB HBM3" and figures["goal_met"]
    assert figures["quickstart"]["iterations"] == 2 and figures["sync"] == {"error": "RuntimeError: CUDA out of memory"}


@pytest.mark.parametrize(
    "kernel, kind",
    [  # kernel names from the H200 traces of the learner update
        ("nvjet_sm90_tst_128x128_64x6_1x2_h_bz_NTT", "matmul"),
        ("gemm_fusion_dot_general_801", "matmul"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1_cga1x1x1_kernel0_0",
         "attention"),
        ("input_reduce_fusion_13", "fusion or other"),
        ("loop_add_fusion_117", "fusion or other"),
        ("wrapped_convert_6", "fusion or other"),
    ],
)
def test_kernels_are_told_apart_by_kind(kernel, kind):
    assert profile.kind_of(kernel) == kind
