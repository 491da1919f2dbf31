"""The SGLang launcher's commands (the servers themselves need a GPU and their own environment), and the
`--sglang_*` sync flags of the entry points."""

import pytest
from absl.testing import flagsaver

from launch import common
from launch.sglang_servers import server_commands

BASE = dict(model_dir="/models/m", host="0.0.0.0", base_port=31000, mem_fraction_static=0.7, weight_version=3,
            sglang_python="/venv/bin/python")


def test_each_server_gets_its_own_gpus_port_and_the_initial_weight_version():
    commands = server_commands(num_servers=2, tp_size=2, first_gpu=4, **BASE)
    assert [env for env, _ in commands] == [{"CUDA_VISIBLE_DEVICES": "4,5"}, {"CUDA_VISIBLE_DEVICES": "6,7"}]
    env, argv = commands[1]
    assert argv[:3] == ["/venv/bin/python", "-m", "sglang.launch_server"]
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags == {"--model-path": "/models/m", "--host": "0.0.0.0", "--port": "31001", "--tp-size": "2",
                     "--mem-fraction-static": "0.7", "--weight-version": "3"}


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="num_servers"):
        server_commands(num_servers=0, tp_size=1, first_gpu=0, **BASE)
    with pytest.raises(ValueError, match="mem_fraction_static"):
        server_commands(num_servers=1, tp_size=1, first_gpu=0, **{**BASE, "mem_fraction_static": 1.5})


REMOTE_URLS = ["http://10.0.0.2:30000", "http://10.0.0.3:30000"]


@pytest.mark.usefixtures("parsed_flags")
def test_sglang_sync_flags_reach_the_client_config(tmp_path):
    with flagsaver.flagsaver(
        sglang_urls=REMOTE_URLS, sync="nccl", sglang_server_tp_sizes=["2", "1"], sglang_master_address="10.0.0.1",
        sglang_master_port=29700, sglang_sync_backend="gloo", sglang_rendezvous_timeout_s=30.0,
        sglang_weight_dtype="bfloat16",
    ):
        config = common.sglang_config(tmp_path / "model", tmp_path / "logs")
    assert (config.urls, config.weight_update, config.server_tp_sizes, config.world_size) == (
        tuple(REMOTE_URLS), "distributed", (2, 1), 4
    )
    assert (config.master_address, config.master_port, config.backend) == ("10.0.0.1", 29700, "gloo")
    assert (config.rendezvous_timeout_s, config.weight_dtype) == (30.0, "bfloat16")
    with flagsaver.flagsaver(sglang_urls=REMOTE_URLS, sync="disk"):
        config = common.sglang_config(tmp_path / "model", tmp_path / "logs")
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
    with flagsaver.flagsaver(sglang_urls=REMOTE_URLS, sync="nccl", **bad_flags):
        with pytest.raises(ValueError, match=message):
            common.sglang_config(tmp_path / "model", tmp_path / "logs")
