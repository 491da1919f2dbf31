"""Start SGLang servers for rollout and wait until each answers /health.

SGLang pins its own torch / transformers / flashinfer versions, which clash with this project's, so it lives in
a virtual environment of its own and runs as separate processes; only its HTTP API and the weight-update group
reach this project (`rollout.sglang_generator.SGLangGenerator`). Once, on a GPU host:

    python -m venv ~/.venvs/sglang
    ~/.venvs/sglang/bin/pip install sglang==0.5.23

Then, for two servers of one GPU each on GPUs 0 and 1:

    python -m launch.sglang_servers --model_dir=/models/Qwen2.5-7B-Instruct --num_servers=2 \
        --sglang_python=~/.venvs/sglang/bin/python

which runs, per server i, `CUDA_VISIBLE_DEVICES=<its GPUs> <sglang_python> -m sglang.launch_server --model-path
<model_dir> --host <host> --port <base_port + i> --tp-size <tp_size> --mem-fraction-static <fraction> --dtype
<server_dtype> --weight-version <weight_version>`, prints the urls to pass to `--sglang_urls`, and keeps the
servers running until interrupted. `--dtype` is the dtype the servers hold weights in, and so the one the learner
sends them in; `--weight-version` makes every answer carry an integer policy version from the first request on.
The weight-update group needs no server flag: the learner forms it over HTTP (`/init_weights_update_group`), and
each server dials the learner's `--sglang_master_address:--sglang_master_port`. `--dry_run` prints the commands
without starting anything. The commands are checked against SGLang 0.5.23's own argument parser
(tests/launch/test_sglang_servers.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
from absl import app, flags

from launch.flag_groups import field_values

# SGLang's --dtype choices (sglang/srt/arg_groups/fields/model.py).
SERVER_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")

# Each of `server_commands`' arguments and the flag that sets it.
_SERVER_ARGUMENTS = {
    "model_dir": flags.DEFINE_string("model_dir", None, "HF model directory every server loads."),
    "num_servers": flags.DEFINE_integer("num_servers", 1, "How many servers to start."),
    "tp_size": flags.DEFINE_integer("tp_size", 1, "GPUs per server (tensor parallel size)."),
    "first_gpu": flags.DEFINE_integer(
        "first_gpu", 0, "Server i uses GPUs first_gpu + i*tp_size ... + tp_size - 1."
    ),
    "host": flags.DEFINE_string("sglang_host", "127.0.0.1", "Interface the servers listen on."),
    "base_port": flags.DEFINE_integer("base_port", 30000, "Server i listens on base_port + i."),
    "mem_fraction_static": flags.DEFINE_float(
        "mem_fraction_static", 0.8, "GPU memory share for weights and KV cache."
    ),
    "dtype": flags.DEFINE_enum(
        "server_dtype", "bfloat16", list(SERVER_DTYPES),
        "SGLang's --dtype: what the servers hold weights in, and so what the learner sends (auto: the model "
        "config's).",
    ),
    "weight_version": flags.DEFINE_integer(
        "weight_version", 0, "Policy version the servers report until updated."
    ),
    "sglang_python": flags.DEFINE_string("sglang_python", sys.executable, "Python of the environment SGLang is in."),
}
_STARTUP_TIMEOUT = flags.DEFINE_float("startup_timeout_s", 900.0, "How long to wait for every /health.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the commands and exit.")


def server_commands(
    *,
    model_dir: str,
    num_servers: int,
    tp_size: int,
    first_gpu: int,
    host: str,
    base_port: int,
    mem_fraction_static: float,
    dtype: str,
    weight_version: int,
    sglang_python: str,
) -> list[tuple[dict[str, str], list[str]]]:
    """(environment additions, argv) of each server."""
    if num_servers < 1 or tp_size < 1:
        raise ValueError(f"need num_servers >= 1 and tp_size >= 1, got {num_servers} and {tp_size}")
    if not 0.0 < mem_fraction_static < 1.0:
        raise ValueError(f"mem_fraction_static must be in (0, 1), got {mem_fraction_static}")
    if dtype not in SERVER_DTYPES:
        raise ValueError(f"dtype must be one of SGLang's {SERVER_DTYPES}, got {dtype!r}")
    commands = []
    for index in range(num_servers):
        gpus = range(first_gpu + index * tp_size, first_gpu + (index + 1) * tp_size)
        argv = [
            os.path.expanduser(sglang_python), "-m", "sglang.launch_server",
            "--model-path", model_dir,
            "--host", host,
            "--port", str(base_port + index),
            "--tp-size", str(tp_size),
            "--mem-fraction-static", str(mem_fraction_static),
            "--dtype", dtype,
            "--weight-version", str(weight_version),
        ]
        commands.append(({"CUDA_VISIBLE_DEVICES": ",".join(str(gpu) for gpu in gpus)}, argv))
    return commands


def wait_until_healthy(urls: list[str], processes: list[subprocess.Popen], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = set(urls)
    while waiting:
        for url, process in zip(urls, processes):
            if process.poll() is not None:
                raise RuntimeError(f"the server for {url} exited with code {process.returncode} before becoming healthy")
        for url in sorted(waiting):
            try:
                if httpx.get(f"{url}/health", timeout=5.0).status_code == 200:
                    waiting.discard(url)
            except httpx.TransportError:
                pass
        if waiting and time.monotonic() > deadline:
            raise TimeoutError(f"no /health answer within {timeout_s:.0f}s from {sorted(waiting)}")
        time.sleep(2.0)


def main(argv: list[str]) -> None:
    del argv
    arguments = field_values(_SERVER_ARGUMENTS)
    commands = server_commands(**arguments)
    urls = [f"http://{arguments['host']}:{arguments['base_port'] + i}" for i in range(len(commands))]
    for env, command in commands:
        print(" ".join(f"{key}={value}" for key, value in env.items()), " ".join(command))
    if _DRY_RUN.value:
        return
    processes = [subprocess.Popen(command, env={**os.environ, **env}) for env, command in commands]
    try:
        wait_until_healthy(urls, processes, _STARTUP_TIMEOUT.value)
        print("SGLang servers ready:", ",".join(urls), flush=True)
        for process in processes:
            process.wait()
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            process.wait()


if __name__ == "__main__":
    # Required only when this module is the program: importing it (tests, other launchers) must not
    # impose its flag on their parses of the global FLAGS.
    flags.mark_flag_as_required("model_dir")
    app.run(main)
