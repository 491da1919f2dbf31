"""SGLang conformance: SGLangGenerator talking HTTP to SGLang 0.5.23's own server code.

The server is `tests/sglang_reference_server.py`: SGLang's FastAPI app, request classes, API contract, request
normalisation, sampling-parameter checks and weight-update receiver (`WeightUpdater`, `FlattenedTensorBucket`),
with a recording stand-in where the scheduler and model would be. Each test compares what we sent (recorded on
our httpx client) with what SGLang parsed and received.
"""

from __future__ import annotations

import json
import socket

import httpx
import pytest
import safetensors.torch
import torch

import rollout.sglang_generator
from rollout.sglang_generator import SGLangConfig, SGLangError, SGLangGenerator
from rollout.transport import read_checkpoint
from rollout.types import SamplingParams
from tests.sglang_reference_server import VOCAB, ReferenceServer

pytestmark = [pytest.mark.sglang_conformance, pytest.mark.time_limit(600)]

MODEL_ARGS = ["--model-path", "/models/conductor", "--weight-version", "0"]
# SGLang's SamplingParams turns top_k=-1 ("off") into this (sampling/sampling_params.py TOP_K_ALL).
TOP_K_ALL = 1 << 30


@pytest.fixture(scope="module")
def reference_server(sglang_site, tmp_path_factory):
    """One reference server per `--dtype`, shared by this module's tests."""
    servers = {}

    def start(dtype: str) -> ReferenceServer:
        if dtype not in servers:
            out_dir = tmp_path_factory.mktemp(f"sglang-{dtype}")
            servers[dtype] = ReferenceServer(sglang_site, out_dir, [*MODEL_ARGS, "--dtype", dtype])
        return servers[dtype]

    yield start
    for server in servers.values():
        server.close()


def recording_client() -> tuple[list[tuple[str, dict | None]], httpx.Client]:
    """An httpx client that keeps (path, JSON body) of every request it sends."""
    sent = []

    def keep(request: httpx.Request) -> None:
        sent.append((request.url.path, json.loads(request.content) if request.content else None))

    return sent, httpx.Client(timeout=600.0, event_hooks={"request": [keep]})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def new_entries(server: ReferenceServer, since: int) -> list[dict]:
    return server.log()[since:]


def assert_every_sent_field_parsed(route: str, sent: dict | None, parsed: dict) -> None:
    """Each field we sent is a field of the class SGLang parsed the body into, with our value (FastAPI drops
    unknown fields without a word, so a misspelt one would vanish here)."""
    for name, value in (sent or {}).items():
        assert name in parsed, f"{route}: SGLang has no field {name!r} (it has {sorted(parsed)})"
        assert parsed[name] == value, f"{route}: {name} sent as {value!r}, parsed as {parsed[name]!r}"


def test_generate_bodies_parse_as_generate_req_input_and_every_sampling_setting_reaches_sglang(
    reference_server, tmp_path
):
    server = reference_server("bfloat16")
    sent, client = recording_client()
    config = SGLangConfig(urls=(server.url,), checkpoint_root=str(tmp_path), sequences_per_request=3)
    generator = SGLangGenerator(config, client=client)
    start = len(server.log())
    prompts = [[1, 2, 3], [40, 50]]
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=4, stop_token_ids=(999, 17), seed=11)
    completions = generator.generate(prompts, params, n=2)

    # The two requests go out concurrently, so they are paired by their rows, not by the order they arrived in.
    bodies = sorted((body for path, body in sent if path == "/generate"), key=lambda body: body["input_ids"])
    parsed = sorted((entry for entry in new_entries(server, start) if entry["route"] == "/generate"),
                    key=lambda entry: entry["request"]["input_ids"])
    assert len(bodies) == len(parsed) == 2  # 4 rows, 3 per request
    seeds = []
    for body, entry in zip(bodies, parsed, strict=True):
        request = entry["request"]
        # normalize_batch_and_arguments keeps a batch of input_ids and expands return_logprob to every row.
        assert request["input_ids"] == body["input_ids"]
        assert request["return_logprob"] == [True] * len(body["input_ids"])
        assert request["sampling_params"] == body["sampling_params"]
        for applied in entry["sampling_params"]:
            assert {key: applied[key] for key in ("temperature", "top_p", "top_k", "max_new_tokens")} == {
                "temperature": 0.7, "top_p": 0.9, "top_k": 5, "max_new_tokens": 4
            }
            assert sorted(applied["stop_token_ids"]) == [17, 999]
            # Nothing we did not ask for changes the distribution the learner recomputes.
            assert (applied["min_p"], applied["repetition_penalty"], applied["frequency_penalty"],
                    applied["presence_penalty"], applied["n"]) == (0.0, 1.0, 0.0, 0.0, 1)
            seeds.append(applied["sampling_seed"])
    assert sorted(seeds) == [11, 12, 13, 14]
    assert [[c.prompt_ids for c in group] for group in completions] == [[(1, 2, 3)] * 2, [(40, 50)] * 2]
    assert completions[1][1].completion_ids == tuple((90 + 14 + 7 * k) % VOCAB for k in range(4))
    assert completions[1][1].logprobs == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    assert {c.policy_version for group in completions for c in group} == {0}
    generator.close()


def test_top_k_off_and_greedy_reach_sglang_as_the_whole_vocabulary_and_top_k_1(reference_server, tmp_path):
    server = reference_server("bfloat16")
    generator = SGLangGenerator(SGLangConfig(urls=(server.url,), checkpoint_root=str(tmp_path)))
    start = len(server.log())
    generator.generate([[7]], SamplingParams(temperature=1.0, top_k=0, max_new_tokens=2), n=1)
    generator.generate([[7]], SamplingParams(temperature=0.0, max_new_tokens=2), n=1)
    sampled, greedy = (entry["sampling_params"][0] for entry in new_entries(server, start))
    assert (sampled["temperature"], sampled["top_k"], sampled["sampling_seed"]) == (1.0, TOP_K_ALL, None)
    assert (greedy["temperature"], greedy["top_k"]) == (1.0, 1)
    generator.close()


def test_a_sampling_field_sglang_does_not_have_is_refused_by_its_api_contract(reference_server, tmp_path, monkeypatch):
    server = reference_server("bfloat16")
    generator = SGLangGenerator(SGLangConfig(urls=(server.url,), checkpoint_root=str(tmp_path)))
    build = rollout.sglang_generator._sglang_sampling_params
    monkeypatch.setattr(rollout.sglang_generator, "_sglang_sampling_params",
                        lambda params, row: {**build(params, row), "seed": 3})
    with pytest.raises(SGLangError, match=r"rejected the request \(400\): unknown field `seed`"):
        generator.generate([[1]], SamplingParams(max_new_tokens=1), n=1)
    generator.close()


def test_disk_update_requests_parse_as_sglangs_and_the_checkpoint_holds_the_servers_dtype(reference_server, tmp_path):
    server = reference_server("bfloat16")
    sent, client = recording_client()
    generator = SGLangGenerator(SGLangConfig(urls=(server.url,), checkpoint_root=str(tmp_path)), client=client)
    assert generator.weight_dtype == "bfloat16"
    start = len(server.log())
    weights = {"model.embed_tokens.weight": torch.randn(5, 3), "model.norm.weight": torch.randn(3)}
    generator.update_weights(weights, version=5)

    control = [(path, body) for path, body in sent if path not in ("/health", "/server_info")]
    entries = new_entries(server, start)
    assert [path for path, _ in control] == [entry["route"] for entry in entries] == [
        "/pause_generation", "/update_weights_from_disk", "/flush_cache", "/continue_generation"
    ]
    for (path, body), entry in zip(control, entries, strict=True):
        if path != "/flush_cache":  # its only parameter is a query parameter
            assert_every_sent_field_parsed(path, body, entry["request"])
    update = entries[1]["request"]
    assert (update["weight_version"], update["flush_cache"]) == ("5", True)
    loaded = read_checkpoint(update["model_path"])
    for name, tensor in weights.items():
        assert loaded[name].dtype == torch.bfloat16
        assert torch.equal(loaded[name], tensor.to(torch.bfloat16))
    assert generator.generate([[1]], SamplingParams(max_new_tokens=1), n=1)[0][0].policy_version == 5
    generator.close()


def weights_of_several_shapes() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(11, 7, generator=generator),
        # A transposed view, as weight_sync hands over a transposed NNX kernel.
        "model.layers.0.self_attn.q_proj.weight": torch.randn(5, 7, generator=generator).T,
        "model.layers.0.input_layernorm.weight": torch.randn(7, generator=generator),
        "model.layers.0.mlp.experts.up_proj": torch.randn(2, 3, 5, generator=generator),
        "model.norm.weight": torch.randn(7, generator=generator).to(torch.bfloat16),
        # An integer buffer keeps its dtype, so a bucket mixes 8-byte elements with 2- or 4-byte ones.
        "model.layers.0.self_attn.rotary_positions": torch.arange(9),
        "lm_head.weight": torch.randn(13, 7, generator=generator),
    }


@pytest.mark.parametrize("server_dtype", ["float32", "bfloat16"])
def test_distributed_buckets_are_rebuilt_by_sglangs_receiver_into_the_tensors_sent(reference_server, server_dtype):
    server = reference_server(server_dtype)
    sent, client = recording_client()
    config = SGLangConfig(
        urls=(server.url,), weight_update="distributed", backend="gloo", master_port=free_port(),
        group_name=f"conformance-{server_dtype}", bucket_bytes=256, rendezvous_timeout_s=120.0,
    )
    generator = SGLangGenerator(config, client=client)
    assert (generator.weight_dtype, generator.server_tp_sizes) == (server_dtype, (1,))
    start = len(server.log())
    weights = weights_of_several_shapes()
    generator.update_weights(weights, version=9)

    entries = new_entries(server, start)
    routes = [entry["route"] for entry in entries]
    buckets = [entry for entry in entries if entry["route"] == "/update_weights_from_distributed"]
    assert len(buckets) >= 3
    assert routes == ["/pause_generation", "/init_weights_update_group", "/begin_weight_update",
                      *["/update_weights_from_distributed"] * len(buckets), "/end_weight_update", "/flush_cache",
                      "/continue_generation"]
    for entry, body in zip([e for e in entries if e["route"] != "/flush_cache"],
                           [b for path, b in sent if path not in ("/health", "/server_info", "/flush_cache")],
                           strict=True):
        assert_every_sent_field_parsed(entry["route"], body, entry["request"])
    assert [bucket["request"]["load_format"] for bucket in buckets] == ["flattened_bucket"] * len(buckets)
    assert [bucket["request"]["weight_version"] for bucket in buckets] == [None] * (len(buckets) - 1) + ["9"]
    assert [bucket["request"]["flush_cache"] for bucket in buckets] == [False] * (len(buckets) - 1) + [True]

    received = {}
    for bucket in buckets:
        received.update(safetensors.torch.load_file(bucket["received"]))
    assert sorted(received) == sorted(weights)
    wire = getattr(torch, server_dtype)
    for name, tensor in weights.items():
        expected = tensor.to(wire) if tensor.is_floating_point() else tensor
        assert (received[name].dtype, received[name].shape) == (expected.dtype, expected.shape), name
        assert torch.equal(received[name], expected), name
    assert generator.generate([[1]], SamplingParams(max_new_tokens=1), n=1)[0][0].policy_version == 9
    generator.close()
