"""SGLang 0.5.23's own HTTP server, with a recording stand-in for what sits behind it (no scheduler, no model).

    python -m tests.sglang_reference_server --site DIR --out_dir DIR -- <sglang server arguments>
    python -m tests.sglang_reference_server --site DIR --print_server_args -- <sglang server arguments>

The first serves `sglang.srt.entrypoints.http_server.app` on a free loopback port and prints one JSON line,
`{"url": ...}`, once it listens; the second prints the `ServerArgs` that SGLang's parser makes of the arguments
(its `/server_info` fields) and exits, with argparse's exit status 2 for arguments SGLang does not take.

SGLang's code here: the routes and their request parsing (FastAPI over `io_struct`'s classes), the `/generate`
API contract check, `GenerateReqInput.normalize_batch_and_arguments` and per-row `SamplingParams` normalize /
verify (as `TokenizerManager` runs them), `prepare_server_args` and `build_server_info` (`/server_info`), and
for weight updates `WeightUpdater.init_weights_update_group` (`init_custom_process_group`) and
`receive_weights_from_distributed` (`FlattenedTensorBucket.empty`, the broadcast, `reconstruct_tensors`).

Ours: `RecordingTokenizerManager`, which records what each route hands it (`GET /conformance/log`), keeps the
weight-update session the way `SchedulerWeightUpdaterManager` does (distributed updates only between
`/begin_weight_update` and `/end_weight_update`), saves each received bucket as a safetensors file in `out_dir`,
and answers `/generate` with the fixed rule of `tests.rollout.fake_sglang` in the shape `TokenizerManager` gives.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import select
import socket
import subprocess
import sys
import time

from tests.sglang_package import import_sglang

VOCAB = 1000
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


class ReferenceServer:
    """This program serving in a subprocess: `url`, `log()` (the parsed requests), `close()`."""

    def __init__(self, site: pathlib.Path, out_dir: pathlib.Path, sglang_argv: list[str],
                 startup_timeout_s: float = 300.0) -> None:
        # Its stderr goes to a file: a pipe nobody reads would stall the server once full.
        self.stderr_path = pathlib.Path(out_dir) / "reference_server.stderr"
        with open(self.stderr_path, "w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.sglang_reference_server", "--site", str(site), "--out_dir",
                 str(out_dir), "--", *sglang_argv],
                cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True,
            )
        ready, _, _ = select.select([self.process.stdout], [], [], startup_timeout_s)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.close()
            raise RuntimeError(f"the SGLang reference server did not start:\n{self.stderr_path.read_text()[-3000:]}")
        self.url = json.loads(line)["url"]

    def log(self) -> list[dict]:
        import httpx

        return httpx.get(f"{self.url}/conformance/log", timeout=30.0).json()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def parsed_server_args(site: pathlib.Path, sglang_argv: list[str]) -> dict:
    """What SGLang's `prepare_server_args` makes of `sglang_argv`, as `/server_info` would report it; raises
    `subprocess.CalledProcessError` (argparse's message in `stderr`) for arguments SGLang does not take."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.sglang_reference_server", "--site", str(site), "--print_server_args", "--",
         *sglang_argv],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


class RecordingTokenizerManager:
    """What SGLang's routes call on `_global_state.tokenizer_manager`, recording each parsed request."""

    def __init__(self, server_args, out_dir: pathlib.Path) -> None:
        from sglang.srt.managers.tokenizer_manager import ServerStatus
        from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

        self.server_args = server_args
        self.out_dir = out_dir
        self.server_status = ServerStatus.Up
        self.gracefully_exit = False
        self.is_generation = True
        self.startup_time = time.time()
        self.weight_version = str(server_args.weight_version)
        self.log: list[dict] = []
        self.session_open = False
        self.buckets = 0
        # The server side of the weight-update group, as a model runner holds it (tp rank 0; no model behind it).
        self.updater = WeightUpdater(
            tp_rank=0, device="cpu", gpu_id=0, model_config=None, custom_weight_loaders={}, get_model=None,
            update_model_fields=None, recapture_cuda_graph=None, get_model_runner=None,
        )

    def _record(self, route: str, obj, **extra) -> None:
        from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

        self.log.append({"route": route, "request": msgspec_to_builtins(obj), **extra})

    async def get_internal_state(self):
        return [{}]

    async def generate_request(self, obj, request=None):
        from sglang.srt.sampling.sampling_params import SamplingParams

        obj.normalize_batch_and_arguments()
        rows = [obj] if obj.is_single else [obj[i] for i in range(len(obj.input_ids))]
        sampling = []
        for row in rows:
            params = SamplingParams(**row.sampling_params)
            params.normalize(None)
            params.verify(VOCAB)
            sampling.append(params)
        self._record("/generate", obj, sampling_params=[_struct_dict(params) for params in sampling])
        answers = [self._answer(row.input_ids, params) for row, params in zip(rows, sampling)]
        yield answers[0] if obj.is_single else answers

    def _answer(self, input_ids: list[int], params) -> dict:
        seed = params.sampling_seed or 0
        tokens, finish = [], {"type": "length", "length": params.max_new_tokens}
        for k in range(params.max_new_tokens):
            token = (sum(input_ids) + seed + 7 * k) % VOCAB
            tokens.append(token)
            if token in (params.stop_token_ids or ()):
                finish = {"type": "stop", "matched": token}
                break
        version = int(self.weight_version) if self.weight_version.isdigit() else 0
        return {
            "text": "",
            "output_ids": tokens,
            "meta_info": {
                "id": f"reference-{len(self.log)}",
                "finish_reason": finish,
                "prompt_tokens": len(input_ids),
                "weight_version": self.weight_version,
                "completion_tokens": len(tokens),
                "cached_tokens": 0,
                "output_token_logprobs": [
                    [-(k + 1) / 10 - version / 100, token, None] for k, token in enumerate(tokens)
                ],
            },
        }

    async def pause_generation(self, obj):
        self._record("/pause_generation", obj)

    async def continue_generation(self, obj):
        self._record("/continue_generation", obj)

    async def flush_cache(self, timeout_s=None):
        from sglang.srt.managers.io_struct import FlushCacheReqOutput

        self.log.append({"route": "/flush_cache", "request": {"timeout_s": timeout_s}})
        return FlushCacheReqOutput(success=True)

    async def update_weights_from_disk(self, obj, request=None):
        self._record("/update_weights_from_disk", obj)
        self._set_version(obj.weight_version)
        return True, "Succeeded to update model weights.", 0

    async def init_weights_update_group(self, obj, request=None):
        self._record("/init_weights_update_group", obj)
        return await asyncio.to_thread(
            self.updater.init_weights_update_group, obj.master_address, obj.master_port, obj.rank_offset,
            obj.world_size, obj.group_name, obj.backend,
        )

    async def begin_weight_update(self, obj, request=None):
        self._record("/begin_weight_update", obj)
        if self.session_open:
            return False, "a weight-update session is already open; call end_weight_update() first"
        self.session_open = True
        return True, "Success"

    async def end_weight_update(self, obj, request=None):
        self._record("/end_weight_update", obj)
        if not self.session_open:
            return False, "no weight-update session is open; call begin_weight_update() first"
        self.session_open = False
        return True, "Success"

    async def update_weights_from_distributed(self, obj, request=None):
        import safetensors.torch

        if not self.session_open:
            self._record("/update_weights_from_distributed", obj)
            return False, ("update_weights_from_distributed must run between begin_weight_update() and "
                           "end_weight_update()")
        try:
            weights = await asyncio.to_thread(
                self.updater.receive_weights_from_distributed, names=obj.names, dtypes=obj.dtypes,
                shapes=obj.shapes, group_name=obj.group_name, load_format=obj.load_format,
            )
        except Exception as error:  # what the scheduler reports for a failed receive
            self._record("/update_weights_from_distributed", obj)
            return False, f"Failed to receive weights: {error}"
        path = self.out_dir / f"bucket-{self.buckets:04d}.safetensors"
        self.buckets += 1
        safetensors.torch.save_file({name: tensor.contiguous() for name, tensor in weights}, os.fspath(path))
        self._record("/update_weights_from_distributed", obj, received=str(path))
        self._set_version(obj.weight_version)
        return True, "Succeeded to update parameter online."

    def _set_version(self, version: str | None) -> None:
        if version is not None:
            self.weight_version = version


def _struct_dict(struct) -> dict:
    """A msgspec struct's fields by name (an `array_like` struct's builtins form is a bare list)."""
    import msgspec

    return {field.name: msgspec.to_builtins(getattr(struct, field.name)) for field in msgspec.structs.fields(struct)}


def serve(server_args, out_dir: pathlib.Path) -> None:
    import torch.distributed as dist
    import uvicorn
    from sglang.srt.entrypoints import http_server

    # A server process has its own default group (its TP group) before it joins a weight-update group.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    manager = RecordingTokenizerManager(server_args, out_dir)
    http_server.set_global_state(
        http_server._GlobalState(tokenizer_manager=manager, template_manager=None, scheduler_info={})
    )

    async def conformance_log():
        return manager.log

    http_server.app.add_api_route("/conformance/log", conformance_log, methods=["GET"])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    # Listening before the URL is printed: a client that connects before uvicorn starts accepting waits in the
    # backlog instead of being refused (which a loaded machine showed).
    listener.listen()
    server = uvicorn.Server(uvicorn.Config(http_server.app, lifespan="off", log_level="warning"))
    print(json.dumps({"url": f"http://127.0.0.1:{listener.getsockname()[1]}"}), flush=True)
    server.run(sockets=[listener])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--site", required=True, help="directory holding the sglang package (tests.sglang_package)")
    parser.add_argument("--out_dir", help="where received weight buckets are written")
    parser.add_argument("--print_server_args", action="store_true")
    args, sglang_argv = parser.parse_known_args()
    sglang_argv = sglang_argv[1:] if sglang_argv[:1] == ["--"] else sglang_argv
    # No model to run a one-token generation for: /health answers from the server's state alone.
    os.environ["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] = "false"
    import_sglang(args.site)
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(sglang_argv)
    if args.print_server_args:
        from sglang.srt.utils.common import build_server_info
        from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

        print(json.dumps(msgspec_to_builtins(build_server_info(server_args, {})), default=str), flush=True)
        return
    serve(server_args, pathlib.Path(args.out_dir))


if __name__ == "__main__":
    sys.exit(main())
