"""The SGLang launcher's commands, checked against SGLang 0.5.23's own argument parser and `/server_info` (the
servers themselves need a GPU and their own environment), and the `--sglang_*` sync flags of the entry points."""

import subprocess

import pytest
from absl.testing import flagsaver

from conductor.generators import sglang_config
from launch.flag_groups import generator as generator_flags
from launch.sglang_servers import server_commands
from rollout.sglang_generator import SGLangConfig, SGLangGenerator
from tests.sglang_reference_server import ReferenceServer, parsed_server_args

BASE = dict(model_dir="/models/m", host="0.0.0.0", base_port=31000, mem_fraction_static=0.7, dtype="bfloat16",
            weight_version=3, sglang_python="/venv/bin/python")


def test_each_server_gets_its_own_gpus_port_and_the_initial_weight_version():
    commands = server_commands(num_servers=2, tp_size=2, first_gpu=4, **BASE)
    assert [env for env, _ in commands] == [{"CUDA_VISIBLE_DEVICES": "4,5"}, {"CUDA_VISIBLE_DEVICES": "6,7"}]
    env, argv = commands[1]
    assert argv[:3] == ["/venv/bin/python", "-m", "sglang.launch_server"]
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags == {"--model-path": "/models/m", "--host": "0.0.0.0", "--port": "31001", "--tp-size": "2",
                     "--mem-fraction-static": "0.7", "--dtype": "bfloat16", "--weight-version": "3"}


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="num_servers"):
        server_commands(num_servers=0, tp_size=1, first_gpu=0, **BASE)
    with pytest.raises(ValueError, match="mem_fraction_static"):
        server_commands(num_servers=1, tp_size=1, first_gpu=0, **{**BASE, "mem_fraction_static": 1.5})
    with pytest.raises(ValueError, match="dtype must be one of SGLang's"):
        server_commands(num_servers=1, tp_size=1, first_gpu=0, **{**BASE, "dtype": "bf16"})


def sglang_arguments(argv: list[str]) -> list[str]:
    """A server command's arguments to SGLang, after `<python> -m sglang.launch_server`."""
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    return argv[3:]


@pytest.mark.sglang_conformance
def test_each_server_command_parses_with_sglangs_own_argument_parser_into_the_recipes_settings(sglang_site):
    assert (sglang_site / "sglang" / "launch_server.py").is_file()
    for index, (_, argv) in enumerate(server_commands(num_servers=2, tp_size=2, first_gpu=4, **BASE)):
        info = parsed_server_args(sglang_site, sglang_arguments(argv))
        settings = ("model_path", "host", "port", "tp_size", "mem_fraction_static", "dtype", "weight_version")
        assert {name: info[name] for name in settings} == {
            "model_path": "/models/m", "host": "0.0.0.0", "port": 31000 + index, "tp_size": 2,
            "mem_fraction_static": 0.7, "dtype": "bfloat16", "weight_version": "3",
        }
        # One weight-update rank per tensor-parallel rank: no pipeline stages or data-parallel replicas.
        assert (info["pp_size"], info["dp_size"], info["enable_dp_attention"]) == (1, 1, False)


@pytest.mark.sglang_conformance
def test_sglangs_parser_refuses_an_argument_it_does_not_take(sglang_site):
    (_, argv), = server_commands(num_servers=1, tp_size=1, first_gpu=0, **BASE)
    with pytest.raises(subprocess.CalledProcessError) as error:
        parsed_server_args(sglang_site, [*sglang_arguments(argv), "--weight-update-group", "g"])
    assert error.value.returncode == 2 and "unrecognized arguments: --weight-update-group g" in error.value.stderr


@pytest.mark.sglang_conformance
@pytest.mark.time_limit(600)
def test_the_client_reads_tp_size_and_dtype_from_the_server_info_of_a_launched_command(sglang_site, tmp_path):
    (_, argv), = server_commands(num_servers=1, tp_size=2, first_gpu=0, **{**BASE, "dtype": "float16"})
    server = ReferenceServer(sglang_site, tmp_path, sglang_arguments(argv))
    try:
        generator = SGLangGenerator(SGLangConfig(urls=(server.url,), weight_update="distributed"))
        assert (generator.server_tp_sizes, generator.weight_dtype) == ((2,), "float16")
        generator.close()
    finally:
        server.close()


REMOTE_URLS = ["http://10.0.0.2:30000", "http://10.0.0.3:30000"]


@pytest.mark.usefixtures("parsed_flags")
def test_sglang_sync_flags_reach_the_client_config(tmp_path):
    with flagsaver.flagsaver(
        generator="sglang", sglang_urls=REMOTE_URLS, sync="nccl", sglang_server_tp_sizes=["2", "1"],
        sglang_master_address="10.0.0.1", sglang_master_port=29700, sglang_sync_backend="gloo", sglang_rendezvous_timeout_s=30.0,
        sglang_weight_dtype="bfloat16",
    ):
        config = sglang_config(generator_flags.from_flags(), tmp_path / "model", tmp_path / "logs")
    assert (config.urls, config.weight_update, config.server_tp_sizes, config.world_size) == (
        tuple(REMOTE_URLS), "distributed", (2, 1), 4
    )
    assert (config.master_address, config.master_port, config.backend) == ("10.0.0.1", 29700, "gloo")
    assert (config.rendezvous_timeout_s, config.weight_dtype) == (30.0, "bfloat16")
    with flagsaver.flagsaver(generator="sglang", sglang_urls=REMOTE_URLS, sync="disk"):
        config = sglang_config(generator_flags.from_flags(), tmp_path / "model", tmp_path / "logs")
    # Unset, the tp sizes, the rendezvous address and the dtype come from the servers.
    assert (config.server_tp_sizes, config.master_address, config.weight_dtype) == (None, None, None)
    assert config.checkpoint_root == str(tmp_path / "logs" / "sync")


@pytest.mark.usefixtures("parsed_flags")
@pytest.mark.parametrize(
    ("bad_flags", "message"),
    [
        ({"sglang_server_tp_sizes": ["2"]}, r"one integer size >= 1 per server url, got \(2,\) for 2 url"),
        ({"sglang_server_tp_sizes": ["2", "two"]}, "--sglang_server_tp_sizes takes integers"),
        ({"sglang_server_tp_sizes": ["2", "0"]}, "server_tp_sizes"),
        ({"sglang_master_port": 70000}, r"master_port must be in \[1, 65535\]"),
        ({"sglang_master_address": "127.0.0.1"}, r"loopback, which http://10.0.0.2:30000 \(another host\)"),
        ({"sglang_rendezvous_timeout_s": 0.0}, "rendezvous_timeout_s must be > 0"),
    ],
)
def test_bad_sglang_sync_flags_are_rejected_before_any_server_is_asked(tmp_path, bad_flags, message):
    with flagsaver.flagsaver(generator="sglang", sglang_urls=REMOTE_URLS, sync="nccl", **bad_flags):
        with pytest.raises(ValueError, match=message):
            sglang_config(generator_flags.from_flags(), tmp_path / "model", tmp_path / "logs")
