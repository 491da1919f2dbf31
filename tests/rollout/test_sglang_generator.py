"""SGLangGenerator against fake servers that speak SGLang's native HTTP schema (tests/rollout/fake_sglang.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
import torch

from rollout.sglang_generator import (
    SGLangConfig,
    SGLangError,
    SGLangGenerator,
    resolve_master_address,
    served_dtype,
)
from rl.pipeline import Pipeline, Round
from rollout.transport import CHECKPOINT_WEIGHTS_FILE
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
    for fake in fakes:
        fake.server_args["dtype"] = "float32"
    generator = make_generator([f.url for f in fakes], tmp_path, model_dir=str(model_dir), keep_checkpoints=1)
    weights = {"model.embed_tokens.weight": torch.arange(6, dtype=torch.float32).reshape(3, 2)}

    generator.update_weights(weights, version=3)

    for fake in fakes:
        assert fake.paths() == [
            "/health", "/server_info", "/pause_generation", "/update_weights_from_disk", "/flush_cache",
            "/continue_generation",
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
    assert fakes[1].paths() == ["/health", "/server_info", "/pause_generation", "/update_weights_from_disk"]
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
    with pytest.raises(ValueError, match="cannot apply token masks"):
        generator.generate([[1]], SamplingParams(), n=1, token_masks=[object()])
    assert "/generate" not in fakes[0].paths()  # refused before any request
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


# The fields of SGLang's InitWeightsUpdateGroupReqInput and UpdateWeightsFromDistributedReqInput
# (python/sglang/srt/managers/io_struct.py) less the internal `rid` / `http_worker_ipc`.
INIT_GROUP_FIELDS = {"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"}
UPDATE_DISTRIBUTED_FIELDS = {
    "names", "dtypes", "shapes", "group_name", "flush_cache", "abort_all_requests", "weight_version", "load_format",
    "torch_empty_cache",
}


@pytest.mark.time_limit(120)
def test_distributed_update_broadcasts_flattened_buckets_over_gloo_in_the_servers_dtype(tmp_path):
    http_port, master_port = free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.rollout.fake_sglang", "--port", str(http_port), "--dtype", "bfloat16"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert server.stdout.readline().strip() == "ready"
        config = SGLangConfig(
            urls=(f"http://127.0.0.1:{http_port}",), weight_update="distributed", backend="gloo",
            master_port=master_port, bucket_bytes=64, retry_backoff_s=0.0,
        )
        generator = SGLangGenerator(config)
        assert (generator.weight_dtype, generator.server_tp_sizes, generator.master_address) == (
            "bfloat16", (1,), "127.0.0.1"
        )
        weights = {
            "model.embed_tokens.weight": torch.randn(4, 3),
            "model.norm.weight": torch.randn(3).to(torch.bfloat16),
            "lm_head.weight": torch.randn(5, 3),
        }
        generator.update_weights(weights, version=7)
        received = httpx.get(f"{config.urls[0]}/fake/weights").json()
        assert sorted(received) == sorted(weights)
        for name, tensor in weights.items():
            torch.testing.assert_close(torch.tensor(received[name]), tensor.to(torch.bfloat16).float())
        assert httpx.get(f"{config.urls[0]}/fake/weight_dtypes").json() == dict.fromkeys(weights, "bfloat16")
        events = httpx.get(f"{config.urls[0]}/fake/events").json()
        (init,) = [body for path, body in events if path == "/init_weights_update_group"]
        assert init == {"master_address": "127.0.0.1", "master_port": master_port, "rank_offset": 1,
                        "world_size": 2, "group_name": "weight_update_group", "backend": "gloo"}
        buckets = [body for path, body in events if path == "/update_weights_from_distributed"]
        assert all(set(body) <= UPDATE_DISTRIBUTED_FIELDS for body in buckets)
        assert [dtype for body in buckets for dtype in body["dtypes"]] == ["bfloat16"] * 3
        # In float32 the weights would fill two 64-byte buckets (48 + 6 bytes, then 60); in bfloat16 all 30 values
        # take 60 bytes, one bucket.
        assert [body["shapes"] for body in buckets] == [[[4, 3], [3], [5, 3]]]
        assert [body["weight_version"] for body in buckets] == ["7"]
        assert generator.generate([[1]], SamplingParams(max_new_tokens=1), n=1)[0][0].policy_version == 7
        generator.close()
    finally:
        server.kill()
        server.wait()


@pytest.mark.time_limit(120)
def test_a_refused_bucket_still_closes_the_weight_update_session_and_leaves_the_servers_paused():
    http_port, master_port = free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.rollout.fake_sglang", "--port", str(http_port), "--fail-updates-with",
         "Failed to update parameter online: size mismatch"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert server.stdout.readline().strip() == "ready"
        config = SGLangConfig(urls=(f"http://127.0.0.1:{http_port}",), weight_update="distributed", backend="gloo",
                              master_port=master_port, group_name="refused-bucket", retry_backoff_s=0.0)
        generator = SGLangGenerator(config)
        with pytest.raises(SGLangError, match="version 3 failed.*size mismatch"):
            generator.update_weights({"lm_head.weight": torch.randn(2, 3)}, version=3)
        events = [path for path, _ in httpx.get(f"{config.urls[0]}/fake/events").json()]
        # Left open, the session would make the server refuse the next update's /begin_weight_update.
        assert events[events.index("/begin_weight_update"):] == [
            "/begin_weight_update", "/update_weights_from_distributed", "/end_weight_update", "/fake/events"
        ]
        assert generator.policy_version == 0
        generator.close()
    finally:
        server.kill()
        server.wait()


def test_config_rejects_mismatched_tp_sizes_bad_ports_and_a_loopback_master_for_remote_servers():
    two = ("http://127.0.0.1:30000", "http://127.0.0.1:30001")
    distributed = dict(weight_update="distributed")
    assert SGLangConfig(urls=two, server_tp_sizes=(2, 1), **distributed).world_size == 4
    assert SGLangConfig(urls=two, **distributed).world_size is None
    with pytest.raises(ValueError, match=r"one integer size >= 1 per server url, got \(2,\) for 2 url"):
        SGLangConfig(urls=two, server_tp_sizes=(2,), **distributed)
    with pytest.raises(ValueError, match="server_tp_sizes"):
        SGLangConfig(urls=two, server_tp_sizes=(2, 0), **distributed)
    for port in (0, -1, 65536):
        with pytest.raises(ValueError, match=r"master_port must be in \[1, 65535\]"):
            SGLangConfig(urls=two, master_port=port, **distributed)
    with pytest.raises(ValueError, match="master_port 30001 is the HTTP port of http://127.0.0.1:30001"):
        SGLangConfig(urls=two, master_port=30001, **distributed)
    remote = ("http://127.0.0.1:30000", "http://10.1.2.3:30000")
    with pytest.raises(ValueError, match=r"loopback, which http://10.1.2.3:30000 \(another host\) cannot reach"):
        SGLangConfig(urls=remote, master_address="127.0.0.1", **distributed)
    with pytest.raises(ValueError, match="loopback"):
        SGLangConfig(urls=remote, master_address="localhost", **distributed)
    assert SGLangConfig(urls=remote, master_address="10.1.2.1", **distributed).master_address == "10.1.2.1"
    with pytest.raises(ValueError, match="backend"):
        SGLangConfig(urls=two, backend="mpi", **distributed)
    with pytest.raises(ValueError, match="rendezvous_timeout_s"):
        SGLangConfig(urls=two, rendezvous_timeout_s=0, **distributed)
    with pytest.raises(ValueError, match="weight_dtype"):
        SGLangConfig(urls=two, weight_dtype="int8", **distributed)


def test_master_address_is_loopback_for_local_servers_and_must_resolve_when_given():
    local = SGLangConfig(urls=("http://localhost:30000", "http://127.0.0.1:30001"), weight_update="distributed")
    assert resolve_master_address(local) == "127.0.0.1"
    named = SGLangConfig(urls=("http://10.1.2.3:30000",), weight_update="distributed", master_address="10.1.2.1")
    assert resolve_master_address(named) == "10.1.2.1"
    unknown = SGLangConfig(
        urls=("http://10.1.2.3:30000",), weight_update="distributed", master_address="learner.invalid"
    )
    with pytest.raises(SGLangError, match="'learner.invalid' does not resolve on this host"):
        resolve_master_address(unknown)


def test_served_dtype_follows_sglangs_rule_for_auto():
    assert served_dtype("bfloat16", None) == "bfloat16"
    assert served_dtype("half", {"torch_dtype": "bfloat16"}) == "float16"
    assert served_dtype("float", None) == "float32"
    assert served_dtype("auto", {"torch_dtype": "bfloat16", "model_type": "llama"}) == "bfloat16"
    assert served_dtype("auto", {"dtype": "float16", "model_type": "qwen2"}) == "float16"
    # SGLang serves a float32 (or dtype-less) checkpoint in float16, Gemma in bfloat16.
    assert served_dtype("auto", {"torch_dtype": "float32", "model_type": "llama"}) == "float16"
    assert served_dtype("auto", {"model_type": "llama"}) == "float16"
    assert served_dtype("auto", {"torch_dtype": "float32", "model_type": "gemma2"}) == "bfloat16"
    assert served_dtype("auto", None) is None
    with pytest.raises(SGLangError, match="unknown server dtype 'int4'"):
        served_dtype("int4", None)


def test_tp_sizes_are_read_from_the_servers_and_a_config_that_disagrees_is_refused(fakes, tmp_path):
    fakes[0].server_args["tp_size"] = 2
    urls = [f.url for f in fakes]
    generator = make_generator(urls, tmp_path, weight_update="distributed", backend="gloo")
    assert generator.server_tp_sizes == (2, 1)
    assert make_generator(urls, tmp_path, weight_update="distributed", server_tp_sizes=(2, 1)).server_tp_sizes == (2, 1)
    with pytest.raises(SGLangError, match=rf"gives {fakes[0].url} a tensor-parallel size of 1, but it runs tp_size=2"):
        make_generator(urls, tmp_path, weight_update="distributed", server_tp_sizes=(1, 1))
    fakes[1].server_args["pp_size"] = 2
    with pytest.raises(SGLangError, match=rf"{fakes[1].url} runs pp_size=2"):
        make_generator(urls, tmp_path, weight_update="distributed")
    # The disk path needs no group, so it does not care.
    assert make_generator(urls, tmp_path).server_tp_sizes is None


@pytest.mark.time_limit(60)
def test_a_rendezvous_a_server_never_joins_fails_within_the_timeout_naming_what_to_check(fakes, tmp_path):
    fakes[0].server_args["tp_size"] = 2
    for fake in fakes:
        fake.join_update_group = False
    master_port = free_port()
    generator = make_generator(
        [f.url for f in fakes], tmp_path, weight_update="distributed", backend="gloo", master_port=master_port,
        rendezvous_timeout_s=1.0, health_timeout_s=1.0,
    )
    start = time.monotonic()
    with pytest.raises(SGLangError) as error:
        generator.update_weights({"w": torch.zeros(2)}, version=1)
    assert time.monotonic() - start < 10
    message = str(error.value)
    assert f"did not form at tcp://127.0.0.1:{master_port} within 1s (world size 4" in message
    assert "tensor-parallel ranks (2, 1)" in message and "Timed out" in message
    assert "--sglang_master_address" in message and "--tp-size" in message
    inits = {url: dict(fake.events)["/init_weights_update_group"] for url, fake in zip(generator.config.urls, fakes)}
    assert all(set(body) == INIT_GROUP_FIELDS for body in inits.values())
    assert [(body["rank_offset"], body["world_size"]) for body in inits.values()] == [(1, 4), (3, 4)]
    assert {(body["master_address"], body["master_port"], body["backend"]) for body in inits.values()} == {
        ("127.0.0.1", master_port, "gloo")
    }
    assert generator.policy_version == 0


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors.values())


def test_disk_sync_writes_the_servers_bfloat16_at_half_the_bytes_and_keeps_float32_for_float32_servers(tmp_path):
    weights = {"model.embed_tokens.weight": torch.randn(64, 64), "lm_head.weight": torch.randn(32, 64)}
    sizes = {}
    for dtype in ("bfloat16", "float32"):
        fake = FakeSGLang(dtype=dtype).start()
        try:
            root = tmp_path / dtype
            generator = SGLangGenerator(SGLangConfig(urls=(fake.url,), checkpoint_root=str(root)))
            assert generator.weight_dtype == dtype
            generator.update_weights(weights, version=1)
            update = dict(fake.events)["/update_weights_from_disk"]
            assert set(update) <= {"model_path", "load_format", "weight_version", "flush_cache", "abort_all_requests"}
            assert {t.dtype for t in fake.weights.values()} == {getattr(torch, dtype)}
            for name, tensor in weights.items():
                torch.testing.assert_close(fake.weights[name], tensor.to(getattr(torch, dtype)), rtol=0, atol=0)
            checkpoint = root / "policy-00000001" / CHECKPOINT_WEIGHTS_FILE
            sizes[dtype] = (tensor_bytes(fake.weights), checkpoint.stat().st_size)
            generator.close()
        finally:
            fake.stop()
    assert sizes["float32"][0] == tensor_bytes(weights) == 2 * sizes["bfloat16"][0]
    assert sizes["bfloat16"][1] < 0.51 * sizes["float32"][1]


def test_auto_servers_get_the_dtype_of_the_model_config_and_a_named_dtype_wins(fakes, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "bfloat16"}))
    urls = [f.url for f in fakes]
    assert make_generator(urls, tmp_path, model_dir=str(model_dir)).weight_dtype == "bfloat16"
    assert make_generator(urls, tmp_path, model_dir=str(model_dir), weight_dtype="float32").weight_dtype == "float32"
    # Without the config, `auto` says nothing: weights travel as they come.
    generator = make_generator([fakes[0].url], tmp_path)
    assert generator.weight_dtype is None
    generator.update_weights({"w": torch.ones(3)}, version=1)
    assert fakes[0].weights["w"].dtype == torch.float32
    fakes[1].server_args["dtype"] = "float16"
    with pytest.raises(SGLangError, match="different dtypes"):
        make_generator(urls, tmp_path, model_dir=str(model_dir))


def test_the_pipeline_syncs_between_requests_and_each_group_names_the_version_that_sampled_it(fakes, tmp_path):
    """The asynchronous pipeline (`rl.pipeline`) against the servers: a sync waits for the /generate in flight, so no
    request meets a paused server (a pause aborts what is in flight), and each group's version, read under the
    generator lock, is the weight_version the servers stamped on its rows."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
    generator = make_generator([f.url for f in fakes], tmp_path, model_dir=str(model_dir), sequences_per_request=2)
    weights = {"model.embed_tokens.weight": torch.zeros(3, 2)}
    lock, version, position = threading.Lock(), [0], [0]

    class World:
        def prompt_ids(self, question):
            return [question + 1, 2]

        def score(self, questions, completions, contexts, sample_ids):
            return [None] * len(questions)

    def next_round():
        position[0] += 2
        return Round([position[0] - 2, position[0] - 1], list(range(8)), seed=position[0])

    pipeline = Pipeline(
        environment=World(), sampler=generator, sampling_params=SamplingParams(max_new_tokens=3), group_size=4,
        groups_per_round=2, max_staleness=1, next_round=next_round, version=lambda: version[0], generator_lock=lock,
    ).start()
    groups = []
    try:
        for new_version in (1, 2, 3):
            groups += [pipeline.next_group() for _ in range(2)]
            with lock:  # what TrainingLoop._sync_weights does
                generator.update_weights(weights, new_version)
                version[0] = new_version
            pipeline.release(2)
        groups += [pipeline.next_group() for _ in range(2)]
    finally:
        pipeline.close()
        generator.close()
    for group in groups:
        assert {c.policy_version for c in group.completions} == {group.policy_version}
        assert {c.finish_reason for c in group.completions} == {"length"}
    assert len({g.policy_version for g in groups}) >= 2  # the weights changed between samples
    for fake in fakes:
        paused = False
        for path in fake.paths():
            paused = {"/pause_generation": True, "/continue_generation": False}.get(path, paused)
            assert not (paused and path == "/generate")

