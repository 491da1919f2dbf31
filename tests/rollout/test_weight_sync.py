"""Flax learner -> TorchGenerator weight sync: log-prob and greedy parity, updates, and atomic disk checkpoints."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import rollout.transport
from models import hf_io
from models.decode import greedy_decode
from rl.learner import Learner, LearnerConfig, OptimizerConfig
from rl.trajectories import build
from rollout.sglang_generator import SGLangConfig, SGLangGenerator
from rollout.torch_generator import TorchGenerator
from rollout.transport import read_checkpoint
from rollout.types import SamplingParams
from rollout.weight_sync import hf_torch_tensors, jax_to_torch, save_checkpoint, sync
from tests.rollout.fake_sglang import FakeSGLang
from tests.tiny_models import tiny_hf_model_dir

PROMPTS = [[5, 17, 33, 9], [100, 7], [64, 65, 66]]


def synced_pair(tmp_path, family, temperature=1.0):
    """A Flax learner on one random checkpoint and a generator started from another, then synced to it."""
    model = hf_io.load(tiny_hf_model_dir(tmp_path / "learner", family, seed=0))
    generator = TorchGenerator(tiny_hf_model_dir(tmp_path / "generator", family, seed=1))
    sync(model, generator, version=0)
    optimizer = OptimizerConfig(learning_rate=3e-2, schedule="constant", max_grad_norm=None)
    learner = Learner(model, LearnerConfig(temperature=temperature, optimizer=optimizer))
    return learner, generator


def as_batch(groups, advantages=None):
    completions = [c for group in groups for c in group]
    advantages = np.zeros(len(completions)) if advantages is None else advantages
    return build(
        [c.prompt_ids for c in completions],
        [c.completion_ids for c in completions],
        [c.logprobs for c in completions],
        advantages,
        [i for i, group in enumerate(groups) for _ in group],
        pad_id=0,
        length_buckets=(32, 128),
    )


def max_logprob_gap(learner, groups) -> float:
    batch = as_batch(groups)
    learner_logprobs = np.asarray(learner.logprobs(batch))
    return float(np.abs(learner_logprobs - batch.sampler_logprobs)[batch.loss_mask].max())


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_generator_logprobs_of_its_samples_equal_the_flax_learners(tmp_path, family):
    learner, generator = synced_pair(tmp_path, family, temperature=3.0)
    groups = generator.generate(PROMPTS, SamplingParams(temperature=3.0, top_p=0.9, max_new_tokens=10, seed=0), n=2)
    assert max_logprob_gap(learner, groups) < 1e-4


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_decoding_agrees_with_the_flax_models_token_for_token(tmp_path, family):
    learner, generator = synced_pair(tmp_path, family)
    groups = generator.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=8), n=1)
    for prompt, (completion,) in zip(PROMPTS, groups):
        assert list(completion.completion_ids) == greedy_decode(learner.model, prompt, 8)


def test_after_a_learner_update_and_sync_the_generator_samples_from_the_new_policy(tmp_path):
    learner, generator = synced_pair(tmp_path, "qwen2", temperature=3.0)
    params = SamplingParams(temperature=3.0, max_new_tokens=8, seed=4)
    groups = generator.generate(PROMPTS, params, n=2)
    rewards = np.array([1.0, -1.0] * len(PROMPTS))
    learner.update(as_batch(groups, advantages=rewards))
    stale_gap = max_logprob_gap(learner, groups)
    pointers = {name: p.data_ptr() for name, p in generator.model.named_parameters()}

    sync(learner.model, generator, version=1)

    assert {name: p.data_ptr() for name, p in generator.model.named_parameters()} == pointers, "sync reallocated"
    assert generator.policy_version == 1
    fresh = generator.generate(PROMPTS, params, n=2)
    assert all(c.policy_version == 1 for group in fresh for c in group)
    assert stale_gap > 1e-2, "the update should have moved the learner away from the sampled log-probs"
    assert max_logprob_gap(learner, fresh) < 1e-4
    assert [c.logprobs for g in fresh for c in g] != [c.logprobs for g in groups for c in g]


def test_an_interrupted_disk_sync_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    learner, generator = synced_pair(tmp_path, "llama")
    root = tmp_path / "sync"
    first = save_checkpoint(learner.model, root / "policy-1", config_dir=tmp_path / "learner")
    assert (first / "config.json").exists()

    def crash_halfway(tensors, path, metadata=None):
        with open(path, "wb") as handle:
            handle.write(b"\0" * 1000)
        raise OSError("disk full")

    monkeypatch.setattr(rollout.transport.safetensors.torch, "save_file", crash_halfway)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(learner.model, root / "policy-2")
    monkeypatch.undo()

    assert sorted(path.name for path in root.iterdir()) == ["policy-1"]
    reader = TorchGenerator(tmp_path / "generator")
    reader.update_weights(read_checkpoint(first), version=1)
    greedy = reader.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=6), n=1)
    assert list(greedy[0][0].completion_ids) == greedy_decode(learner.model, PROMPTS[0], 6)
    with pytest.raises(FileExistsError):
        save_checkpoint(learner.model, first)


def test_sync_into_sglang_casts_the_learners_float32_to_the_servers_bfloat16(tmp_path):
    model = hf_io.load(tiny_hf_model_dir(tmp_path / "learner", "qwen2", seed=0))
    reference = hf_torch_tensors(model)
    assert {t.dtype for t in reference.values()} == {torch.float32}
    fake = FakeSGLang(dtype="bfloat16").start()
    try:
        generator = SGLangGenerator(SGLangConfig(urls=(fake.url,), checkpoint_root=str(tmp_path / "sync")))
        sync(model, generator, version=1)
        assert sorted(fake.weights) == sorted(reference)
        for name, tensor in reference.items():
            assert fake.weights[name].dtype == torch.bfloat16, name
            torch.testing.assert_close(fake.weights[name], tensor.to(torch.bfloat16), rtol=0, atol=0)
        generator.close()
    finally:
        fake.stop()


class RecordingGenerator:
    weight_dtype = "bfloat16"

    def update_weights(self, named_tensors, version):
        self.received = dict(named_tensors)


def test_sync_casts_on_the_learners_side_to_a_generators_weight_dtype(tmp_path):
    model = hf_io.load(tiny_hf_model_dir(tmp_path / "learner", "llama", seed=0))
    generator = RecordingGenerator()
    sync(model, generator, version=1)
    assert {t.dtype for t in generator.received.values()} == {torch.bfloat16}
    sync(model, generator, version=2, dtype="float32")
    assert {t.dtype for t in generator.received.values()} == {torch.float32}


def test_jax_to_torch_shares_single_device_memory_and_gathers_sharded_arrays():
    single = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    view = jax_to_torch(single)
    assert view.data_ptr() == single.unsafe_buffer_pointer()
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    sharded = jax.device_put(single.astype(jnp.bfloat16).T, jax.NamedSharding(mesh, jax.P("x", None)))
    gathered = jax_to_torch(sharded)
    assert gathered.dtype == torch.bfloat16
    torch.testing.assert_close(gathered.float(), torch.arange(12, dtype=torch.float32).reshape(3, 4).T)


@pytest.mark.slow
def test_smollm2_generator_logprobs_and_greedy_match_the_flax_learner(tmp_path):
    from models.tokenizer import load_tokenizer, render_chat
    from models.zoo import smollm2_135m_instruct

    model_dir = smollm2_135m_instruct()
    tokenizer = load_tokenizer(model_dir)
    prompts = [render_chat(tokenizer, [{"role": "user", "content": q}]) for q in ("What is 2 + 2?", "Name a colour.")]
    learner = Learner(hf_io.load(model_dir), LearnerConfig(temperature=1.0))
    generator = TorchGenerator(model_dir)
    with torch.no_grad():
        for param in generator.model.parameters():
            param.zero_()
    sync(learner.model, generator, version=2)

    groups = generator.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=16, seed=0), n=2)
    assert all(c.policy_version == 2 for group in groups for c in group)
    assert max_logprob_gap(learner, groups) < 1e-3
    greedy = generator.generate(prompts[:1], SamplingParams(temperature=0.0, max_new_tokens=8), n=1)
    assert list(greedy[0][0].completion_ids) == greedy_decode(learner.model, prompts[0], 8)
