"""Client of SGLang's native HTTP API (0.5.x): generation over several servers, and weight updates between steps.

Wire format (sglang/srt/managers/io_struct.py and entrypoints/http_server.py):
- `POST /generate` with `GenerateReqInput` fields `input_ids` (a batch), `sampling_params` (one dict per row) and
  `return_logprob`; each answer carries `output_ids` and `meta_info` with `output_token_logprobs`
  (`[logprob, token_id, text]` per generated token), `finish_reason` (`{"type": "stop" | "length" | "abort"}`)
  and `weight_version`. SGLang's sampler reports `log_softmax(logits / T)` before top-k / top-p filtering, the
  quantity the learner recomputes.
- `POST /update_weights_from_disk` (`model_path`, `weight_version`, `flush_cache`) or `POST
  /init_weights_update_group` (`master_address`, `master_port`, `rank_offset`, `world_size`, `group_name`,
  `backend`) + `POST /update_weights_from_distributed` (`names`, `dtypes`, `shapes`, `group_name`,
  `load_format="flattened_bucket"`, `flush_cache`, `weight_version`): `{"success", "message"}`, 400 on failure.
- `POST /pause_generation` (`mode`), `POST /continue_generation`, `POST /flush_cache`, `GET /health`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import pathlib
import shutil
import threading
import time
from typing import Any, Literal, Mapping, Sequence

import httpx
import torch

from rollout.transport import (
    as_torch,
    broadcast_bucket,
    bucket_request,
    flatten_bucket,
    join_weight_update_group,
    plan_buckets,
    write_checkpoint,
)
from rollout.types import Completion, SamplingParams

_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}


class SGLangError(RuntimeError):
    """A server refused, failed, or could not be reached; the message names the server and what it said."""


@dataclasses.dataclass(frozen=True)
class SGLangConfig:
    """Where the servers are and how weights reach them.

    `weight_update="disk"` writes each policy version as an HF checkpoint under `checkpoint_root` (a path every
    server can read) with `model_dir`'s config files; `"distributed"` broadcasts flattened buckets from this
    process (rank 0) to every server's GPUs over a torch.distributed group (`backend="nccl"` on GPUs).
    """

    urls: tuple[str, ...]
    request_timeout_s: float = 600.0
    health_timeout_s: float = 5.0
    max_attempts: int = 3
    retry_backoff_s: float = 0.5
    sequences_per_request: int = 64
    weight_update: Literal["disk", "distributed"] = "disk"
    checkpoint_root: str | None = None
    model_dir: str | None = None
    keep_checkpoints: int = 2
    master_address: str = "127.0.0.1"
    master_port: int = 29600
    server_tp_sizes: tuple[int, ...] | None = None
    group_name: str = "weight_update_group"
    backend: str = "nccl"
    bucket_bytes: int = 512 * 1024 * 1024

    def __post_init__(self) -> None:
        urls = tuple(url.rstrip("/") for url in self.urls)
        if not urls:
            raise ValueError("SGLangConfig needs at least one server url")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"server url must start with http:// or https://, got {url!r}")
        if len(set(urls)) != len(urls):
            raise ValueError(f"server urls repeat: {urls}")
        object.__setattr__(self, "urls", urls)
        for name in ("request_timeout_s", "health_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.retry_backoff_s < 0:
            raise ValueError(f"retry_backoff_s must be >= 0, got {self.retry_backoff_s}")
        if self.sequences_per_request < 1:
            raise ValueError(f"sequences_per_request must be >= 1, got {self.sequences_per_request}")
        if self.weight_update not in ("disk", "distributed"):
            raise ValueError(f"weight_update must be 'disk' or 'distributed', got {self.weight_update!r}")
        if self.weight_update == "disk" and self.checkpoint_root is None:
            raise ValueError("weight_update='disk' needs checkpoint_root, a directory every server can read")
        if self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        tp_sizes = self.server_tp_sizes if self.server_tp_sizes is not None else (1,) * len(urls)
        if len(tp_sizes) != len(urls) or any(size < 1 for size in tp_sizes):
            raise ValueError(f"server_tp_sizes must give one size >= 1 per server, got {tp_sizes} for {len(urls)}")
        object.__setattr__(self, "server_tp_sizes", tuple(int(size) for size in tp_sizes))
        if self.bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {self.bucket_bytes}")


def _sglang_sampling_params(params: SamplingParams, row_index: int) -> dict[str, Any]:
    sampling = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "max_new_tokens": params.max_new_tokens,
        "stop_token_ids": list(params.stop_token_ids),
    }
    if params.seed is not None:
        # One seed per row: the n copies of a prompt must not draw the same sample.
        sampling["sampling_seed"] = params.seed + row_index
    return sampling


def _server_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if "message" in body:
            return str(body["message"])
    return response.text.strip()


class SGLangGenerator:
    """Samples through one or more SGLang servers and pushes new weights to all of them.

    Requests are split into batches of `sequences_per_request` rows and spread round-robin over the healthy
    servers; a batch whose server is unreachable or answers 5xx is retried on the next server (up to
    `max_attempts`, with backoff), and that server is skipped until its `/health` answers again. A 4xx is the
    caller's mistake and is raised at once.
    """

    def __init__(self, config: SGLangConfig, *, policy_version: int = 0, client: httpx.Client | None = None) -> None:
        self.config = config
        self.policy_version = int(policy_version)
        self._client = client or httpx.Client(timeout=config.request_timeout_s)
        self._down: set[str] = set()
        self._round_robin = 0
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2 * len(config.urls))
        self._update_group = None
        health = self.health()
        if not any(health.values()):
            raise SGLangError(f"no SGLang server answers /health: {', '.join(config.urls)}")

    def health(self) -> dict[str, bool]:
        """Probes `GET /health` on every server and remembers which are down."""
        status = {}
        for url in self.config.urls:
            try:
                status[url] = self._client.get(f"{url}/health", timeout=self.config.health_timeout_s).status_code == 200
            except httpx.TransportError:
                status[url] = False
        with self._lock:
            self._down = {url for url, ok in status.items() if not ok}
        return status

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, n: int
    ) -> list[list[Completion]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        prompts = [[int(t) for t in prompt] for prompt in prompt_ids]
        for index, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {index} is empty; every prompt needs at least one token")
        if not prompts:
            return []
        if self._down:
            self.health()
        rows = [prompt for prompt in prompts for _ in range(n)]
        size = self.config.sequences_per_request
        starts = range(0, len(rows), size)
        with self._lock:
            first_server = self._round_robin
            self._round_robin += len(starts)
        futures = [
            self._pool.submit(self._generate_batch, rows[start : start + size], start, params, first_server + i)
            for i, start in enumerate(starts)
        ]
        completions = [completion for future in futures for completion in future.result()]
        return [completions[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _generate_batch(
        self, rows: list[list[int]], first_row: int, params: SamplingParams, server_slot: int
    ) -> list[Completion]:
        body = {
            "input_ids": rows,
            "sampling_params": [_sglang_sampling_params(params, first_row + i) for i in range(len(rows))],
            "return_logprob": True,
        }
        failures = []
        for attempt in range(self.config.max_attempts):
            url = self._pick_server(server_slot + attempt)
            if url is None:
                failures.append("no healthy server left")
                break
            try:
                response = self._client.post(f"{url}/generate", json=body)
            except httpx.TransportError as error:
                self._mark_down(url)
                failures.append(f"{url}: {type(error).__name__}: {error}")
            else:
                if response.status_code == 200:
                    return [self._completion(row, item, url) for row, item in zip(rows, response.json(), strict=True)]
                message = _server_message(response)
                if response.status_code < 500:
                    raise SGLangError(f"{url}/generate rejected the request ({response.status_code}): {message}")
                self._mark_down(url)
                failures.append(f"{url}: HTTP {response.status_code}: {message}")
            time.sleep(self.config.retry_backoff_s * 2**attempt)
        raise SGLangError(f"/generate failed after {len(failures)} attempts: " + "; ".join(failures))

    def _pick_server(self, slot: int) -> str | None:
        with self._lock:
            healthy = [url for url in self.config.urls if url not in self._down]
        return healthy[slot % len(healthy)] if healthy else None

    def _mark_down(self, url: str) -> None:
        with self._lock:
            self._down.add(url)

    def _completion(self, row: list[int], item: Mapping[str, Any], url: str) -> Completion:
        meta = item["meta_info"]
        token_logprobs = meta["output_token_logprobs"]
        completion_ids = tuple(int(entry[1]) for entry in token_logprobs)
        if "output_ids" in item and tuple(item["output_ids"]) != completion_ids:
            raise SGLangError(f"{url}: output_ids and output_token_logprobs disagree for one sequence")
        version = str(meta.get("weight_version"))
        if not version.isdigit():
            raise SGLangError(
                f"{url} reports weight_version {version!r}; start servers with --weight-version <int> "
                "(launch/sglang_servers.py does) so completions can name their policy version"
            )
        finish = meta.get("finish_reason") or {"type": "abort"}
        return Completion(
            prompt_ids=tuple(row),
            completion_ids=completion_ids,
            logprobs=tuple(float(entry[0]) for entry in token_logprobs),
            finish_reason=_FINISH_REASONS[finish["type"]],
            policy_version=int(version),
        )

    def update_weights(self, named_tensors: Mapping[str, Any], version: int) -> None:
        """Pauses every server, loads the new weights tagged `version`, flushes the prefix cache, resumes.

        On failure the servers are left paused (their weights may be partly replaced) and the error says which
        server refused and why; `policy_version` keeps its old value.
        """
        tensors = {name: as_torch(value) for name, value in named_tensors.items()}
        if not tensors:
            raise ValueError("update_weights got no tensors")
        self._post_all("/pause_generation", {"mode": "abort"})
        try:
            if self.config.weight_update == "disk":
                self._update_from_disk(tensors, version)
            else:
                self._update_from_distributed(tensors, version)
        except SGLangError as error:
            raise SGLangError(
                f"weight update to version {version} failed, servers left paused at unknown weights: {error}"
            ) from error
        self._post_all("/flush_cache", None)
        self._post_all("/continue_generation", {})
        self.policy_version = int(version)

    def _update_from_disk(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        root = pathlib.Path(self.config.checkpoint_root)
        checkpoint = write_checkpoint(tensors, root / f"policy-{version:08d}", config_dir=self.config.model_dir)
        self._post_all(
            "/update_weights_from_disk",
            {"model_path": str(checkpoint), "weight_version": str(version), "flush_cache": True},
        )
        older = sorted(root.glob("policy-*"))[: -self.config.keep_checkpoints]
        for path in older:
            shutil.rmtree(path, ignore_errors=True)

    def _update_from_distributed(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        device = torch.device("cuda") if self.config.backend == "nccl" else torch.device("cpu")
        if self._update_group is None:
            self._update_group = self._init_update_group()
        buckets = plan_buckets(tensors, self.config.bucket_bytes)
        for index, names in enumerate(buckets):
            flat, layout = flatten_bucket([(name, tensors[name]) for name in names])
            last = index == len(buckets) - 1
            body = {
                **bucket_request(layout),
                "group_name": self.config.group_name,
                "load_format": "flattened_bucket",
                "flush_cache": last,
                "weight_version": str(version) if last else None,
            }
            # Each server's request returns only after it has received the broadcast, so they run alongside it.
            pending = self._submit_all("/update_weights_from_distributed", body)
            broadcast_bucket(flat.to(device), self._update_group)
            self._gather(pending)

    def _init_update_group(self) -> torch.distributed.ProcessGroup:
        tp_sizes = self.config.server_tp_sizes
        world_size = 1 + sum(tp_sizes)
        requests = {
            url: {
                "master_address": self.config.master_address,
                "master_port": self.config.master_port,
                "rank_offset": 1 + sum(tp_sizes[:i]),
                "world_size": world_size,
                "group_name": self.config.group_name,
                "backend": self.config.backend,
            }
            for i, url in enumerate(self.config.urls)
        }
        # Servers block in the rendezvous until this process (rank 0) joins too.
        pending = [self._pool.submit(self._post, url, "/init_weights_update_group", body) for url, body in requests.items()]
        group = join_weight_update_group(
            master_address=self.config.master_address,
            master_port=self.config.master_port,
            rank=0,
            world_size=world_size,
            group_name=self.config.group_name,
            backend=self.config.backend,
        )
        self._gather(pending)
        return group

    def _post_all(self, path: str, body: Mapping[str, Any] | None) -> None:
        self._gather(self._submit_all(path, body))

    def _submit_all(self, path: str, body: Mapping[str, Any] | None) -> list[concurrent.futures.Future]:
        return [self._pool.submit(self._post, url, path, body) for url in self.config.urls]

    @staticmethod
    def _gather(futures: list[concurrent.futures.Future]) -> None:
        """Waits for every request, then raises one error naming every server that failed."""
        errors = []
        for future in futures:
            try:
                future.result()
            except SGLangError as error:
                errors.append(str(error))
        if errors:
            raise SGLangError("; ".join(errors))

    def _post(self, url: str, path: str, body: Mapping[str, Any] | None) -> None:
        try:
            response = self._client.post(f"{url}{path}", json=body)
        except httpx.TransportError as error:
            self._mark_down(url)
            raise SGLangError(f"{url}{path} unreachable: {type(error).__name__}: {error}") from error
        if response.status_code != 200:
            raise SGLangError(f"{url}{path} answered {response.status_code}: {_server_message(response)}")
        try:
            reply = response.json()
        except ValueError:
            return
        if isinstance(reply, dict) and reply.get("success") is False:
            raise SGLangError(f"{url}{path} reported failure: {reply.get('message', '')}")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()
