"""Client of SGLang's native HTTP API (0.5.23): generation over several servers, and weight updates between steps.

Wire format (sglang/srt/managers/io_struct.py and entrypoints/http_server.py; checked against SGLang 0.5.23's own
server code by tests/rollout/test_sglang_conformance.py):
- `POST /generate` with `GenerateReqInput` fields `input_ids` (a batch), `sampling_params` (one dict per row) and
  `return_logprob`; each answer carries `output_ids` and `meta_info` with `output_token_logprobs`
  (`[logprob, token_id, text]` per generated token), `finish_reason` (`{"type": "stop" | "length" | "abort"}`)
  and `weight_version`. SGLang's sampler reports `log_softmax(logits / T)` before top-k / top-p filtering, the
  quantity the learner recomputes.
- `POST /update_weights_from_disk` (`model_path`, `weight_version`, `flush_cache`) or `POST
  /init_weights_update_group` (`master_address`, `master_port`, `rank_offset`, `world_size`, `group_name`,
  `backend`) + `POST /begin_weight_update`, one `POST /update_weights_from_distributed` per bucket (`names`,
  `dtypes`, `shapes`, `group_name`, `load_format="flattened_bucket"`, `flush_cache`, `weight_version`), `POST
  /end_weight_update`: `{"success", "message"}`, 400 on failure. A distributed update outside the begin / end
  session is refused.
- `POST /pause_generation` (`mode`), `POST /continue_generation`, `POST /flush_cache`, `GET /health`.
- `GET /server_info` (`/get_server_info` before it was renamed): the server's `ServerArgs` as a dict, of which this
  client reads `tp_size`, `pp_size`, `dp_size`, `enable_dp_attention`, `dtype` and `model_path`.

A server joins the weight-update group with `tp_size` ranks, `rank_offset + tp_rank`
(model_executor/model_runner_components/weight_updater.py), so the group's world size is 1 (this process) + the
sum of the servers' tp sizes.
A server holds its weights in its `--dtype`; for `auto`, the model config's dtype, float32 turned into float16
(bfloat16 for Gemma) (configs/model_config.py `_get_and_verify_dtype`). Weights travel in that dtype: float32
learner weights would cost bfloat16 servers twice the bytes on disk and on the wire for the same result.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import ipaddress
import json
import logging
import pathlib
import shutil
import socket
import threading
import time
import urllib.parse
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
    rendezvous_url,
    write_checkpoint,
)
from rollout.types import Completion, SamplingParams, TokenMask

_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}
# The dtypes weights travel in, by SGLang's names; its server args also spell float16 'half' and float32 'float'.
WEIGHT_DTYPES = ("float32", "bfloat16", "float16")
_SGLANG_DTYPE_NAMES = {"half": "float16", "float16": "float16", "float": "float32", "float32": "float32",
                       "bfloat16": "bfloat16"}

log = logging.getLogger(__name__)


class SGLangError(RuntimeError):
    """A server refused, failed, or could not be reached; the message names the server and what it said."""


@dataclasses.dataclass(frozen=True)
class SGLangConfig:
    """Where the servers are and how weights reach them.

    `weight_update="disk"` writes each policy version as an HF checkpoint under `checkpoint_root` (a path every
    server can read) with `model_dir`'s config files; `"distributed"` broadcasts flattened buckets from this
    process (rank 0) to every server's GPUs over a torch.distributed group (`backend="nccl"` on GPUs) that meets at
    `master_address:master_port` on this host.

    `server_tp_sizes=None` reads each server's tensor-parallel size from its `/server_info` (given, it is checked
    against it); `master_address=None` is 127.0.0.1 when every server is on this host, else this host's address
    on its route to the first remote server; `weight_dtype=None` sends weights in the servers' own dtype. The
    group must form within `rendezvous_timeout_s`, else the update fails with what to check.
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
    master_address: str | None = None
    master_port: int = 29600
    server_tp_sizes: tuple[int, ...] | None = None
    group_name: str = "weight_update_group"
    backend: Literal["nccl", "gloo"] = "nccl"
    rendezvous_timeout_s: float = 300.0
    bucket_bytes: int = 512 * 1024 * 1024
    weight_dtype: str | None = None

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
        for name in ("request_timeout_s", "health_timeout_s", "rendezvous_timeout_s"):
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
        if self.server_tp_sizes is not None:
            tp_sizes = tuple(self.server_tp_sizes)
            if len(tp_sizes) != len(urls) or any(int(size) != size or size < 1 for size in tp_sizes):
                raise ValueError(
                    f"server_tp_sizes must give one integer size >= 1 per server url, got {tp_sizes} for "
                    f"{len(urls)} url(s) {urls}"
                )
            object.__setattr__(self, "server_tp_sizes", tuple(int(size) for size in tp_sizes))
        if not 1 <= self.master_port <= 65535:
            raise ValueError(f"master_port must be in [1, 65535], got {self.master_port}")
        for url in urls:
            parts = urllib.parse.urlsplit(url)
            if is_loopback_host(parts.hostname) and parts.port == self.master_port:
                raise ValueError(f"master_port {self.master_port} is the HTTP port of {url}; pick a free port")
        if self.master_address is not None:
            if not self.master_address.strip():
                raise ValueError("master_address must be a host name or IP address, got an empty string")
            remote = [url for url in urls if not is_loopback_host(urllib.parse.urlsplit(url).hostname)]
            if self.weight_update == "distributed" and is_loopback_host(self.master_address) and remote:
                raise ValueError(
                    f"master_address {self.master_address} is loopback, which {remote[0]} (another host) cannot "
                    "reach: give an address of this host that the servers can reach, or leave it unset to use the "
                    "address of this host's route to that server"
                )
        if self.backend not in ("nccl", "gloo"):
            raise ValueError(f"backend must be 'nccl' or 'gloo', got {self.backend!r}")
        if not self.group_name:
            raise ValueError("group_name must not be empty")
        if self.bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {self.bucket_bytes}")
        if self.weight_dtype is not None and self.weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"weight_dtype must be one of {WEIGHT_DTYPES} or None, got {self.weight_dtype!r}")

    @property
    def world_size(self) -> int | None:
        """Ranks of the weight-update group: this process and every server's tensor-parallel ranks (None while
        the tp sizes are still to be read from the servers)."""
        return None if self.server_tp_sizes is None else 1 + sum(self.server_tp_sizes)


def is_loopback_host(host: str | None) -> bool:
    """Whether `host` (a name or an IP address) names this machine's loopback interface."""
    if host is None:
        return False
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def served_dtype(server_dtype: str, model_config: Mapping[str, Any] | None) -> str | None:
    """The dtype a server started with `--dtype server_dtype` holds its weights in, by SGLang's rule; None when it
    runs `auto` and the model's config.json (`model_config`) is not at hand."""
    name = server_dtype.lower()
    if name != "auto":
        if name not in _SGLANG_DTYPE_NAMES:
            raise SGLangError(f"unknown server dtype {server_dtype!r}")
        return _SGLANG_DTYPE_NAMES[name]
    if model_config is None:
        return None
    text_config = model_config.get("text_config") or model_config
    config_dtype = text_config.get("dtype") or text_config.get("torch_dtype")
    config_dtype = _SGLANG_DTYPE_NAMES.get(str(config_dtype), "float32") if config_dtype else "float32"
    if config_dtype == "float32":
        return "bfloat16" if str(text_config.get("model_type", "")).startswith("gemma") else "float16"
    return config_dtype


def resolve_master_address(config: SGLangConfig) -> str:
    """The address the servers dial for the weight-update rendezvous: `config.master_address` once it resolves,
    else 127.0.0.1 when every server is on this host, else this host's address on its route to the first remote
    server (a UDP socket's `connect` picks the route without sending anything)."""
    if config.master_address is not None:
        try:
            socket.getaddrinfo(config.master_address, config.master_port)
        except socket.gaierror as error:
            raise SGLangError(
                f"master_address {config.master_address!r} does not resolve on this host ({error}); give an IP "
                "address of this host that every server can reach"
            ) from error
        return config.master_address
    parts = [urllib.parse.urlsplit(url) for url in config.urls]
    remote = [part for part in parts if not is_loopback_host(part.hostname)]
    if not remote:
        return "127.0.0.1"
    host, port = remote[0].hostname, remote[0].port or 80
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(address)
            return probe.getsockname()[0]
    except OSError as error:
        raise SGLangError(
            f"cannot find this host's address on the route to {host} ({error}); set master_address "
            "(--sglang_master_address) to an address of this host that every server can reach"
        ) from error


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
        if isinstance(error, str):  # /generate's API contract check answers {"error": "<what is wrong>"}
            return error
        if "message" in body:
            return str(body["message"])
    return response.text.strip()


def _in_dtype(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """`tensor` cast to `dtype` when both are floating point (integer buffers keep their dtype)."""
    if dtype is None or not tensor.is_floating_point() or tensor.dtype == dtype:
        return tensor
    return tensor.to(dtype)


class SGLangGenerator:
    """Samples through one or more SGLang servers and pushes new weights to all of them.

    Requests are split into batches of `sequences_per_request` rows and spread round-robin over the healthy
    servers; a batch whose server is unreachable or answers 5xx is retried on the next server (up to
    `max_attempts`, with backoff), and that server is skipped until its `/health` answers again. A 4xx is the
    caller's mistake and is raised at once.

    On start it reads every server's `/server_info`: `weight_dtype` is the dtype weights travel in (the servers'
    own unless the config names one; None when no server tells, and weights then travel as given), and for
    distributed updates `server_tp_sizes` and `master_address` are settled before the first update.
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
        infos: dict[str, dict[str, Any] | SGLangError] = {}
        for url in config.urls:
            try:
                infos[url] = self._read_server_info(url)
            except SGLangError as error:
                infos[url] = error
        self.weight_dtype = self._choose_weight_dtype(infos)
        self.server_tp_sizes = config.server_tp_sizes
        self.master_address = config.master_address
        if config.weight_update == "distributed":
            self.server_tp_sizes = self._check_tp_sizes(infos)
            self.master_address = resolve_master_address(config)

    def _read_server_info(self, url: str) -> dict[str, Any]:
        """The server's arguments from `GET /server_info` (`/get_server_info` on SGLang versions before the rename)."""
        failures = []
        for path in ("/server_info", "/get_server_info"):
            try:
                response = self._client.get(f"{url}{path}")
            except httpx.TransportError as error:
                raise SGLangError(f"{url}{path} unreachable: {type(error).__name__}: {error}") from error
            try:
                info = response.json() if response.status_code == 200 else None
            except ValueError:
                info = None
            if isinstance(info, dict):
                return info
            failures.append(f"{path} answered {response.status_code}")
        raise SGLangError(f"{url} tells nothing about itself: {'; '.join(failures)}")

    def _model_config(self, info: Mapping[str, Any]) -> dict[str, Any] | None:
        """The served model's config.json: from `model_dir`, else from the server's model path when it is
        readable here."""
        for directory in (self.config.model_dir, info.get("model_path")):
            if directory and (pathlib.Path(directory) / "config.json").is_file():
                return json.loads((pathlib.Path(directory) / "config.json").read_text())
        return None

    def _choose_weight_dtype(self, infos: Mapping[str, dict[str, Any] | SGLangError]) -> str | None:
        served, unknown = {}, []
        for url, info in infos.items():
            dtype = None
            if isinstance(info, dict):
                dtype = served_dtype(str(info.get("dtype", "auto")), self._model_config(info))
            if dtype is None:
                unknown.append(url)
            else:
                served[url] = dtype
        if self.config.weight_dtype is not None:
            differing = {url: dtype for url, dtype in served.items() if dtype != self.config.weight_dtype}
            if differing:
                log.warning("weights travel in %s, but servers hold %s", self.config.weight_dtype, differing)
            return self.config.weight_dtype
        if len(set(served.values())) > 1:
            raise SGLangError(
                f"the servers hold their weights in different dtypes {served}; start them with one --dtype, or "
                "name the dtype to send (--sglang_weight_dtype)"
            )
        if unknown:
            log.warning(
                "cannot tell the weight dtype of %s (no readable /server_info, or --dtype auto without the model's "
                "config.json here); %s", unknown,
                f"sending {next(iter(served.values()))}" if served else "weights travel in the learner's dtype",
            )
        return next(iter(served.values()), None)

    def _check_tp_sizes(self, infos: Mapping[str, dict[str, Any] | SGLangError]) -> tuple[int, ...]:
        """Each server's tensor-parallel size, as the server reports it, checked against `server_tp_sizes`."""
        given = self.config.server_tp_sizes
        sizes = []
        for index, url in enumerate(self.config.urls):
            info = infos[url]
            if not isinstance(info, dict):
                if given is None:
                    raise SGLangError(
                        f"cannot read the tensor-parallel size of {url} ({info}); give one size per server "
                        "(server_tp_sizes, --sglang_server_tp_sizes)"
                    )
                sizes.append(given[index])
                continue
            tp_size, pp_size, dp_size = (int(info.get(key, 1)) for key in ("tp_size", "pp_size", "dp_size"))
            if pp_size > 1 or (dp_size > 1 and not info.get("enable_dp_attention")):
                raise SGLangError(
                    f"{url} runs pp_size={pp_size}, dp_size={dp_size}: a server joins the weight-update group with "
                    "one rank per tensor-parallel rank (rank_offset + tp_rank), which its pipeline stages or "
                    "data-parallel replicas would share; start one server per replica instead "
                    "(launch/sglang_servers.py --num_servers)"
                )
            if given is not None and given[index] != tp_size:
                raise SGLangError(
                    f"server_tp_sizes gives {url} a tensor-parallel size of {given[index]}, but it runs "
                    f"tp_size={tp_size}: the weight-update group's world size would be wrong and its rendezvous "
                    "would never complete"
                )
            sizes.append(tp_size)
        return tuple(sizes)

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
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, n: int,
        token_masks: Sequence[TokenMask | None] | None = None,
    ) -> list[list[Completion]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if token_masks is not None and any(mask is not None for mask in token_masks):
            # SGLang constrains decoding by a grammar given up front (regex, EBNF, JSON schema), not by a callback
            # per step: a token mask would have to be compiled into one.
            raise ValueError("SGLangGenerator cannot apply token masks; decode with the in-process torch generator")
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
        wire_dtype = None if self.weight_dtype is None else getattr(torch, self.weight_dtype)
        tensors = {name: _in_dtype(as_torch(value), wire_dtype) for name, value in named_tensors.items()}
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
        # SGLang loads broadcast weights only inside a weight-update session (managers/scheduler_components/
        # weight_updater.py); a session left open would refuse the next one, so it is closed after a failure too.
        self._post_all("/begin_weight_update", {})
        try:
            self._broadcast_buckets(tensors, version, device)
        except SGLangError as error:
            try:
                self._post_all("/end_weight_update", {})
            except SGLangError as end_error:
                raise SGLangError(f"{error}; closing the weight-update session failed too: {end_error}") from error
            raise
        self._post_all("/end_weight_update", {})

    def _broadcast_buckets(self, tensors: dict[str, torch.Tensor], version: int, device: torch.device) -> None:
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
        tp_sizes = self.server_tp_sizes
        world_size = 1 + sum(tp_sizes)
        requests = {
            url: {
                "master_address": self.master_address,
                "master_port": self.config.master_port,
                "rank_offset": 1 + sum(tp_sizes[:i]),
                "world_size": world_size,
                "group_name": self.config.group_name,
                "backend": self.config.backend,
            }
            for i, url in enumerate(self.config.urls)
        }
        timeout_s = self.config.rendezvous_timeout_s
        # A server answers once the group has formed, so its request may take as long as the rendezvous.
        request_timeout_s = timeout_s + self.config.health_timeout_s
        pending = [
            self._pool.submit(self._post, url, "/init_weights_update_group", body, request_timeout_s)
            for url, body in requests.items()
        ]
        address = rendezvous_url(self.master_address, self.config.master_port)
        try:
            group = join_weight_update_group(
                master_address=self.master_address,
                master_port=self.config.master_port,
                rank=0,
                world_size=world_size,
                group_name=self.config.group_name,
                backend=self.config.backend,
                timeout=datetime.timedelta(seconds=timeout_s),
            )
        except (RuntimeError, OSError) as error:
            answered, _ = concurrent.futures.wait(pending, timeout=self.config.health_timeout_s)
            replies = [str(future.exception()) for future in answered if future.exception() is not None]
            raise SGLangError(
                f"the weight-update group did not form at {address} within {timeout_s:g}s (world size {world_size}: "
                f"this process as rank 0 and the tensor-parallel ranks {tp_sizes} of {', '.join(self.config.urls)}): "
                f"{type(error).__name__}: {str(error).rstrip('.')}. Check that every server can reach "
                f"{self.master_address} on port {self.config.master_port} (firewall; master_address, "
                "--sglang_master_address, must be an address of this host the servers route to), that no other "
                "process holds that port (--sglang_master_port), and that each server's --tp-size matches "
                "server_tp_sizes (--sglang_server_tp_sizes)"
                + (f". The servers said: {'; '.join(replies)}" if replies else "")
            ) from error
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

    def _post(self, url: str, path: str, body: Mapping[str, Any] | None, timeout_s: float | None = None) -> None:
        try:
            timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
            response = self._client.post(f"{url}{path}", json=body, timeout=timeout)
        except httpx.TransportError as error:
            self._mark_down(url)
            what = "did not answer in time" if isinstance(error, httpx.TimeoutException) else "unreachable"
            raise SGLangError(f"{url}{path} {what}: {type(error).__name__}: {error}") from error
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
