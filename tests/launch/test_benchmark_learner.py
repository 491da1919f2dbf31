"""The learner suite's accelerator figure (a bf16 update of a Qwen2.5-1.5B-shaped model), run here on a shrunken
shape of the same config: the path a GPU or TPU takes, minus the size."""

import json

import jax
import numpy as np
import pytest
from flax import nnx

from launch.benchmark_suites import learner as learner_suite
from models import zoo
from models.config import ModelConfig
from models.sharding import make_mesh
from models.transformer import Transformer
from tests import tiny_models

SMALL = learner_suite.QWEN25_1_5B | {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
                                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                     "head_dim": 16}  # fmt: skip


def _counted_update_flops(hf_config: dict, batch: int, prompt: int, completion: int) -> int:
    """Forward + backward matmul FLOPs of one update, counted from the weight shapes of the model the learner builds
    (abstract, so a 1.5B shape costs no memory): a [m, n] kernel does 2mn FLOPs per token forward and 4mn backward
    (the input's and the weight's gradients); the tied embedding, read as the LM head, does the same on the
    completion positions only; per layer and sequence of T tokens, attention's scores QK^T and weighted values PV
    are two products of 2 T^2 d FLOPs each forward (d = heads x head_dim; every score is computed, masked or not),
    three times that with backward."""
    model = nnx.eval_shape(lambda: Transformer(ModelConfig.from_hf(hf_config), rngs=nnx.Rngs(0)))
    shapes = {jax.tree_util.keystr(path): leaf.shape
              for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))}  # fmt: skip
    kernel_weights = sum(int(np.prod(shape)) for path, shape in shapes.items() if "['kernel']" in path)
    vocab, hidden = shapes["['embed_tokens']['embedding'].value"]
    q_width = shapes["['layers'][0]['self_attn']['q_proj']['kernel'].value"][1]
    layers = 1 + max(int(path.split("['layers'][")[1].split("]")[0]) for path in shapes if "['layers']" in path)
    length = prompt + completion
    matmuls = 6 * kernel_weights * batch * length
    head = 6 * vocab * hidden * batch * completion
    attention = 3 * layers * batch * 2 * (2 * length * length * q_width)
    return matmuls + head + attention


def _shapes(name: str) -> tuple[dict, dict]:
    if name == "test-sized":
        return SMALL, dict(batch=4, prompt=16, completion=16)
    if name == "accelerator":
        return learner_suite.QWEN25_1_5B, learner_suite.ACCELERATOR_SHAPE
    config = json.loads((zoo.smollm2_135m_instruct() / "config.json").read_text())
    return config, dict(batch=learner_suite.BATCH, prompt=learner_suite.PROMPT, completion=learner_suite.COMPLETION)


@pytest.mark.parametrize("name", ["test-sized", "accelerator", "cpu comparison"])
def test_update_flops_match_a_count_from_the_model_weights(name):
    hf_config, shape = _shapes(name)
    batch, prompt, completion = shape["batch"], shape["prompt"], shape["completion"]
    counted = _counted_update_flops(hf_config, batch, prompt, completion)
    length = prompt + completion
    assert learner_suite._update_flops(hf_config, batch * length, length, batch * completion) == counted


def test_the_bf16_update_figure_runs_and_counts_its_tokens_and_model_flops():
    report = learner_suite.accelerator_update(SMALL, batch=4, prompt=16, completion=16, micro_batch=2, matmul_size=256)

    figures = report.figures
    (row,) = report.rows
    median_s, tokens_per_s, mfu = row[1], row[3], row[4]
    assert figures["batch"] == 4 and figures["micro_batch_size"] == 2
    assert tokens_per_s == 4 * 32 / median_s
    assert figures["flax_tokens_per_s"] == round(tokens_per_s, 1)
    assert figures["update_tflops"] == pytest.approx(_counted_update_flops(SMALL, 4, 16, 16) / 1e12, rel=1e-5)
    assert 0 < mfu < 1
    assert json.dumps(figures)  # the suite's JSON line must serialise


def test_the_bf16_update_figure_over_a_mesh_counts_every_device():
    # What a multi-process run times: the update over a mesh of every process's devices (here one process's four).
    report = learner_suite.accelerator_update(SMALL, batch=8, prompt=16, completion=16, micro_batch=4, matmul_size=256,
                                              mesh=make_mesh(fsdp=4))
    (row,) = report.rows
    median_s, tokens_per_s, mfu = row[1], row[3], row[4]
    assert (report.figures["devices"], report.figures["processes"]) == (4, 1)
    assert tokens_per_s == 8 * 32 / median_s
    assert 0 < mfu < 1


def test_the_cpu_engines_run_in_their_own_processes_and_compute_the_same_first_gradient(tmp_path):
    # The comparison's engines on a tiny llama: each process builds its engine from the same checkpoint and rows, so
    # the first updates' gradient norms agree to float32 rounding; the shared-prompt batch has other rows.
    model_dir = tiny_models.tiny_hf_model_dir(tmp_path, "llama")
    shape = dict(batch=4, prompt=8, completion=learner_suite.COMPLETION, vocab=256, groups=2)
    results = learner_suite.time_engines(("flax", "flax_micro_batches", "flax_shared_prompts", "torch"), model_dir,
                                         shape, repeats=2)  # fmt: skip

    for result in results.values():
        assert len(result["seconds"]) == 2 and all(seconds > 0 for seconds in result["seconds"])
        assert result["first_update_s"] > 0
    norms = {engine: result["first_grad_norm"] for engine, result in results.items()}
    assert norms["torch"] > 0
    assert norms["flax"] == pytest.approx(norms["torch"], rel=1e-4)
    assert norms["flax_micro_batches"] == pytest.approx(norms["torch"], rel=1e-4)
    assert abs(norms["flax_shared_prompts"] - norms["torch"]) > 1e-3 * norms["torch"]


def test_an_engine_that_fails_in_its_process_ends_the_suite_instead_of_hanging_it(tmp_path):
    with pytest.raises(RuntimeError, match=r"'no such engine' engine's process ended \(exit code 1\)"):
        learner_suite.time_engines(("no such engine",), tmp_path, {}, repeats=1)
