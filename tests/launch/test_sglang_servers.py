"""The SGLang launcher's commands (the servers themselves need a GPU and their own environment)."""

import pytest

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
