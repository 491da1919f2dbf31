"""SGLangGenerator against fake servers that speak SGLang's native HTTP schema (tests/rollout/fake_sglang.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import httpx
import pytest
import torch

from rollout.sglang_generator import SGLangConfig, SGLangError, SGLangGenerator
from rollout.types import SamplingParams
from tests.rollout.fake_sglang import VOCAB, FakeSGLang

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def expected_tokens(prompt, seed, max_new_tokens, stop=()):
    tokens = []
    for k in range(max_new_tokens):
        tokens.append((sum(prompt) + seed + 7 * k) % VOCAB)
        if tokens[-1] in stop:
            break
    return tokens


@pytest.fixture
def fakes():
    servers = [FakeSGLang().start(), FakeSGLang().start()]
    yield servers
    for server in servers:
        server.stop()


def make_generator(urls, tmp_path, **overrides):
    config = SGLangConfig(urls=tuple(urls), checkpoint_root=str(tmp_path / "ckpt"), retry_backoff_s=0.0, **overrides)
    return SGLangGenerator(config)


def test_generate_returns_ids_logprobs_finish_and_version_per_row(fakes, tmp_path):
    fake = fakes[0]
    generator = make_generator([fake.url], tmp_path)
    prompts = [[1, 2, 3], [10, 20]]
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=5, seed=100, stop_token_ids=(120,))
    result = generator.generate(prompts, params, n=2)

    assert [len(group) for group in result] == [2, 2]
    for p, group in enumerate(result):
        for j, completion in enumerate(group):
            row = 2 * p + j
            tokens = expected_tokens(prompts[p], 100 + row, 5, stop=(120,))
            assert completion.prompt_ids == tuple(prompts[p])
            assert list(completion.completion_ids) == tokens
            assert completion.logprobs == pytest.approx([-(k + 1) / 10 for k in range(len(tokens))])
            assert completion.finish_reason == ("stop" if tokens[-1] == 120 else "length")
            assert completion.policy_version == 0
    # Row 0 (prompt sum 6, seed 100) draws 106, 113, 120 and stops on 120; the others run to the length limit.
    assert [c.finish_reason for g in result for c in g] == ["stop", "length", "length", "length"]
    assert len(result[0][0].completion_ids) == 3

    (_, body), = [event for event in fake.events if event[0] == "/generate"]
    assert body["input_ids"] == [[1, 2, 3], [1, 2, 3], [10, 20], [10, 20]]
    assert body["return_logprob"] is True
    assert body["sampling_params"][0] == {
        "temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_new_tokens": 5, "stop_token_ids": [120], "sampling_seed": 100
    }
    assert [sp["sampling_seed"] for sp in body["sampling_params"]] == [100, 101, 102, 103]


def test_batches_are_spread_over_two_servers_and_reassembled_in_order(fakes, tmp_path):
    generator = make_generator([f.url for f in fakes], tmp_path, sequences_per_request=2)
    prompts = [[5], [6], [7]]
    result = generator.generate(prompts, SamplingParams(max_new_tokens=3, seed=0), n=2)

    assert [f.generate_requests for f in fakes] == [2, 1]
    for p, group in enumerate(result):
        for j, completion in enumerate(group):
            assert list(completion.completion_ids) == expected_tokens(prompts[p], 2 * p + j, 3)
    assert generator.generate([], SamplingParams(), n=1) == []


def test_disk_update_pauses_loads_flushes_then_continues_and_versions_propagate(fakes, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
    generator = make_generator([f.url for f in fakes], tmp_path, model_dir=str(model_dir), keep_checkpoints=1)
    weights = {"model.embed_tokens.weight": torch.arange(6, dtype=torch.float32).reshape(3, 2)}

    generator.update_weights(weights, version=3)

    for fake in fakes:
        assert fake.paths() == [
            "/health", "/pause_generation", "/update_weights_from_disk", "/flush_cache", "/continue_generation"
        ]
        update = dict(fake.events)["/update_weights_from_disk"]
        assert update["weight_version"] == "3" and update["flush_cache"] is True
        assert (tmp_path / "ckpt" / "policy-00000003" / "config.json").exists()
        torch.testing.assert_close(fake.weights["model.embed_tokens.weight"], weights["model.embed_tokens.weight"])
    assert generator.policy_version == 3
    completion = generator.generate([[1]], SamplingParams(max_new_tokens=2, seed=0), n=1)[0][0]
    assert completion.policy_version == 3
    assert completion.logprobs == pytest.approx([-0.1 - 0.03, -0.2 - 0.03])

    generator.update_weights(weights, version=4)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["policy-00000004"]


def test_update_rejected_with_400_raises_names_server_and_leaves_servers_paused(fakes, tmp_path):
    fakes[1].fail_updates_with = "Failed to update weights: size mismatch for lm_head.weight"
    generator = make_generator([f.url for f in fakes], tmp_path)

    with pytest.raises(SGLangError) as error:
        generator.update_weights({"w": torch.zeros(2)}, version=1)

    message = str(error.value)
    assert "version 1" in message and fakes[1].url in message and "size mismatch for lm_head.weight" in message
    assert "400" in message
    assert generator.policy_version == 0
    assert fakes[1].paths() == ["/health", "/pause_generation", "/update_weights_from_disk"]
    assert fakes[1].paused


def test_server_down_is_skipped_and_all_down_is_a_clear_error(fakes, tmp_path):
    generator = make_generator([f.url for f in fakes], tmp_path)
    fakes[0].stop()

    result = generator.generate([[1], [2]], SamplingParams(max_new_tokens=2, seed=0), n=2)
    assert [list(c.completion_ids) for g in result for c in g] == [
        expected_tokens([1], 0, 2), expected_tokens([1], 1, 2), expected_tokens([2], 2, 2), expected_tokens([2], 3, 2)
    ]
    assert fakes[1].generate_requests == 1
    assert generator.health() == {fakes[0].url: False, fakes[1].url: True}

    fakes[1].stop()
    with pytest.raises(SGLangError, match="failed after"):
        generator.generate([[1]], SamplingParams(max_new_tokens=2), n=1)
    with pytest.raises(SGLangError, match="no SGLang server answers /health"):
        make_generator([f.url for f in fakes], tmp_path)


def test_5xx_is_retried_elsewhere_but_4xx_is_raised_at_once(fakes, tmp_path):
    generator = make_generator([f.url for f in fakes], tmp_path)
    fakes[0].fail_generate_with_status = 503
    result = generator.generate([[4]], SamplingParams(max_new_tokens=2, seed=0), n=1)
    assert list(result[0][0].completion_ids) == expected_tokens([4], 0, 2)
    assert (fakes[0].generate_requests, fakes[1].generate_requests) == (1, 1)

    fakes[0].fail_generate_with_status = None
    fakes[1].fail_generate_with_status = 400
    generator = make_generator([fakes[1].url], tmp_path)
    with pytest.raises(SGLangError, match=r"rejected the request \(400\): fake server failure"):
        generator.generate([[4]], SamplingParams(max_new_tokens=2), n=1)
    assert fakes[1].generate_requests == 2


def test_non_integer_weight_version_is_refused_with_the_fix(tmp_path):
    fake = FakeSGLang(weight_version="default").start()
    try:
        generator = make_generator([fake.url], tmp_path)
        with pytest.raises(SGLangError, match="--weight-version"):
            generator.generate([[1]], SamplingParams(max_new_tokens=1), n=1)
    finally:
        fake.stop()


def test_bad_input_and_config_are_rejected(fakes, tmp_path):
    generator = make_generator([fakes[0].url], tmp_path)
    with pytest.raises(ValueError, match="n must be"):
        generator.generate([[1]], SamplingParams(), n=0)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generator.generate([[1], []], SamplingParams(), n=1)
    with pytest.raises(ValueError, match="at least one server"):
        SGLangConfig(urls=(), checkpoint_root="/tmp")
    with pytest.raises(ValueError, match="http"):
        SGLangConfig(urls=("localhost:30000",), checkpoint_root="/tmp")
    with pytest.raises(ValueError, match="checkpoint_root"):
        SGLangConfig(urls=("http://a:1",))
    with pytest.raises(ValueError, match="server_tp_sizes"):
        SGLangConfig(urls=("http://a:1", "http://b:1"), weight_update="distributed", server_tp_sizes=(1,))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(120)
def test_distributed_update_broadcasts_flattened_buckets_over_gloo(tmp_path):
    http_port, master_port = free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.rollout.fake_sglang", "--port", str(http_port)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert server.stdout.readline().strip() == "ready"
        config = SGLangConfig(
            urls=(f"http://127.0.0.1:{http_port}",), weight_update="distributed", backend="gloo",
            master_port=master_port, bucket_bytes=64, retry_backoff_s=0.0,
        )
        generator = SGLangGenerator(config)
        weights = {
            "model.embed_tokens.weight": torch.randn(4, 3),
            "model.norm.weight": torch.randn(3).to(torch.bfloat16),
            "lm_head.weight": torch.randn(5, 3),
        }
        generator.update_weights(weights, version=7)
        received = httpx.get(f"{config.urls[0]}/fake/weights").json()
        assert sorted(received) == sorted(weights)
        for name, tensor in weights.items():
            torch.testing.assert_close(torch.tensor(received[name]), tensor.float())
        assert generator.generate([[1]], SamplingParams(max_new_tokens=1), n=1)[0][0].policy_version == 7
        generator.close()
    finally:
        server.kill()
        server.wait()
