"""The rollout engine's flags: torch in this process or SGLang servers, and how weights reach them."""

from __future__ import annotations

from typing import get_args

from absl import flags

from conductor.generators import WEIGHT_DTYPE_CHOICES, Engine, GeneratorConfig, Sync
from launch.flag_groups import field_choices, field_values
from rollout.sglang_generator import SGLangConfig

_FIELDS = {
    "engine": flags.DEFINE_enum("generator", "torch", get_args(Engine), "Rollout engine."),
    "device": flags.DEFINE_string("generator_device", "cpu", "Torch device of the in-process generator."),
    "sync": flags.DEFINE_enum(
        "sync", "inprocess", get_args(Sync),
        "Weight sync transport: in-process (torch generator), disk (SGLang /update_weights_from_disk), "
        "nccl (SGLang /update_weights_from_distributed).",
    ),
    "sync_dir": flags.DEFINE_string("sync_dir", None, "Shared directory for disk sync (default: <logdir>/sync)."),
    "sglang_weight_dtype": flags.DEFINE_enum(
        "sglang_weight_dtype", "auto", WEIGHT_DTYPE_CHOICES,
        "dtype of the weights --sync=disk and --sync=nccl send to SGLang servers; auto: the servers' own (from their "
        "/server_info: --dtype, or for --dtype=auto the model's config dtype).",
    ),
    "sglang_master_address": flags.DEFINE_string(
        "sglang_master_address", None,
        "Address of this host that the SGLang servers dial for the --sync=nccl rendezvous. Default: 127.0.0.1 when "
        "every server is local, else this host's address on its route to the first remote server.",
    ),
    "sglang_master_port": flags.DEFINE_integer(
        "sglang_master_port", 29600, "Free port of this host for the --sync=nccl rendezvous, open to the servers."
    ),
    "sglang_sync_backend": flags.DEFINE_enum(
        "sglang_sync_backend", "nccl", field_choices(SGLangConfig, "backend"),
        "torch.distributed backend of --sync=nccl (gloo: CPU tensors).",
    ),
    "sglang_rendezvous_timeout_s": flags.DEFINE_float(
        "sglang_rendezvous_timeout_s", 300.0,
        "--sync=nccl: seconds the servers and this process have to form the weight-update group before the update "
        "fails with what to check.",
    ),
}
_SGLANG_URLS = flags.DEFINE_list("sglang_urls", [], "SGLang server base URLs (generator=sglang).")
_SGLANG_TP_SIZES = flags.DEFINE_list(
    "sglang_server_tp_sizes", [],
    "Tensor-parallel size of each --sglang_urls server, in order (--sync=nccl: the weight-update group has 1 + their "
    "sum ranks). Empty: read from each server's /server_info; given: checked against it.",
)


def from_flags() -> GeneratorConfig:
    try:
        tp_sizes = tuple(int(size) for size in _SGLANG_TP_SIZES.value) or None
    except ValueError:
        raise ValueError(f"--sglang_server_tp_sizes takes integers, got {_SGLANG_TP_SIZES.value}") from None
    return GeneratorConfig(
        **field_values(_FIELDS), sglang_urls=tuple(_SGLANG_URLS.value), sglang_server_tp_sizes=tp_sizes
    )
