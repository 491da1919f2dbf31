"""`--suite=gpu`: one run on a CUDA GPU, meant to end within 8 minutes, of what the GPU side of this stack is for.

- **quickstart**: `launch/configs/quickstart.cfg` trained to its end as a user runs it (a subprocess), the learner on
  JAX's GPU and the torch generator on the GPU too (`--generator_device=cuda`). Reported: the iterations done, the
  run's wall time, each phase's share of an iteration (generate, score, learn, sync: medians over the iterations
  after the first, which compiles, and totals over the whole run), and the mean reward over the first and the last
  fifth of the iterations. Stopped at `QUICKSTART_TIME_BOX_S`, it reports the iterations it finished.
- **learner**: the learner suite's accelerator figure (`launch.benchmark_suites.learner.accelerator_update`): a bf16
  update of a Qwen2.5-1.5B-shaped model, its tokens/s, its MFU against the bf16 matmul rate measured in the same run
  and its peak device memory; then one more update traced with `jax.profiler` (into `--profile_dir` when given), and
  its kernel time by kind with the top kernels (`launch.benchmark_suites.profile`).
- **sync**: the in-process weight sync (`launch.benchmark_suites.sync.in_process_seconds`) of a Qwen2.5-1.5B-shaped
  model (random weights) from the Flax learner into a TorchGenerator on the GPU, into a float32 generator (what
  `--generator_device=cuda` runs) and cast to bfloat16 on the GPU into a bfloat16 one, each against a device-to-device
  copy of the same bytes.

`learner_options`, run only when asked for (`run(parts=("learner_options",))`), times the same update with the
einsum attention and with micro-batches of 2, to show what each setting is worth on the GPU at hand.

Each part that fails is reported as failed and the others still run; each prints its figures as a JSON line as soon
as it ends, so a run cut short keeps what it measured. Without a CUDA GPU that both JAX and torch see, the suite
prints one line naming what it found (`jax.devices()`, `torch.cuda.is_available()`) and exits 0.

JAX allocates GPU memory on demand here (unless one of JAX's allocator variables is set), as `launch.train` does with
the torch generator on the GPU: its default, reserving 75% of the GPU when its backend starts, would leave the
quickstart's process and the torch generators a quarter. The quickstart starts with `RETAIN_HOST_MEMORY=0` unless
set: `conductor.host_memory`'s malloc settings slow XLA:GPU's compiles several times over.

**On an offline GPU host** such as this workplace's lent machines (no network; their image has JAX with a CUDA
plugin, torch with CUDA, flax, optax, orbax and transformers, under `python3`, so nothing large is installed):
1. On a machine with network, once: `python -m launch.benchmark_suites.gpu .cache-gpu` writes SmolLM2's tokenizer, without
   the weights, to `.cache-gpu/conductor-rl/` (the quickstart's tiny Conductor reads nothing else; `models.zoo` cannot
   download there) and the cp312 wheels of `gpu_requirements.txt` (the packages the image lacks) to
   `.cache-gpu/wheels/`. `.cache-gpu/` is git-ignored, so it travels only as a carried path (within the tool's 64 MiB).
2. There, from a copy of the working tree with `.cache-gpu/` beside it (the device tool's `run`, with
   `carry=[".cache-gpu"]` and `timeout_s=450`, which leaves a 15-minute lease room to rerun a part or two):

       python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
       .cache-gpu/wheels/*.whl && export PYTHONPATH=/tmp/site:$PWD XDG_CACHE_HOME=$PWD/.cache-gpu \
       PYTHONUNBUFFERED=1 && set -o pipefail && python3 -m launch.benchmark --suite=gpu 2>&1 | tee $OUT/gpu.log

   A rerun of some parts on the same warm machine: the same command with the last step replaced by
   `python3 -c "from launch.benchmark_suites import common, gpu; common.emit(gpu.run(parts=('learner', 'sync')))"`.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import torch
import transformers
from absl import app
from flax import nnx

from conductor import host_memory
from conductor.generators import JAX_ALLOCATOR_VARIABLES
from launch.benchmark_suites import learner as learner_suite
from launch.benchmark_suites import sync as sync_suite
from launch.benchmark_suites.common import Report
from launch.benchmark_suites.e2e import GOAL_LEARN_SYNC_SHARE, PHASES
from models import zoo
from models.config import ModelConfig
from models.transformer import Transformer
from rl.metrics import first_and_last_fifth, read_metrics
from rollout.torch_generator import TorchGenerator

PARTS = ("quickstart", "learner", "sync")
# Measured only when asked for (`run(parts=...)`): the learner update under the settings a user can change that move
# its MFU, each a fresh compile of the 1.5B update (about a minute or more), so beyond the suite's 8 minutes.
OPTIONAL_PARTS = ("learner_options",)
LEARNER_OPTIONS = (
    {"attention_implementation": "einsum"},
    {"micro_batch": 2},
    {"attention_implementation": "einsum", "micro_batch": 2},
)
# A learner option starts only when at least this much of the options' time box is left.
LEARNER_OPTION_S = 100
QUICKSTART_CONFIG = "launch/configs/quickstart.cfg"
# The whole suite's goal; the quickstart's box leaves the learner and sync parts (1-2 min together) inside it.
GOAL_SUITE_SECONDS = 480
QUICKSTART_TIME_BOX_S = 240
SYNC_DTYPES = ("float32", "bfloat16")
REQUIREMENTS = pathlib.Path(__file__).with_name("gpu_requirements.txt")
# The lent GPU machines' python3, and the manylinux tags their wheels may carry.
DEVICE_PYTHON = "3.12"
DEVICE_PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34)) + ("manylinux2014_x86_64",)


def devices_found() -> dict[str, Any]:
    found = {
        "jax_backend": jax.default_backend(),
        "jax_devices": [str(device) for device in jax.devices()],
        "torch_cuda_available": torch.cuda.is_available(),
    }
    if found["torch_cuda_available"]:
        found["torch_cuda_device"] = torch.cuda.get_device_name(0)
    return found


def missing_gpu(found: Mapping[str, Any]) -> str | None:
    """The line to print when the suite cannot run (None when it can): it needs JAX and torch both on a CUDA GPU."""
    if found["jax_backend"] in ("gpu", "cuda") and found["torch_cuda_available"]:
        return None
    return (
        f"no CUDA GPU for --suite=gpu: jax.devices() = {found['jax_devices']}, torch.cuda.is_available() = "
        f"{found['torch_cuda_available']}; it needs one that both see, so nothing was measured"
    )


def flagfile_value(path: str | os.PathLike, name: str) -> str | None:
    """The last value a flagfile gives `--name` (None when it gives none)."""
    value = None
    for line in pathlib.Path(path).read_text().splitlines():
        if line.startswith(f"--{name}="):
            value = line.split("=", 1)[1]
    return value


def summarize_quickstart(records: Sequence[Mapping[str, Any]], planned_iterations: int) -> dict[str, Any]:
    """Iterations done, each phase's share of an iteration and the reward's first and last fifth, from a run's
    metrics records (`rl.metrics.read_metrics`). Shares by median leave out the first iteration (compilation) when
    there are others; shares of the run divide each phase's total by the iterations' total."""
    summary: dict[str, Any] = {"iterations": len(records), "iterations_planned": planned_iterations,
                               "finished": len(records) == planned_iterations}  # fmt: skip
    if not records:
        return summary
    timed = records[1:] or records
    median_iteration = statistics.median(r["time/iteration"] for r in timed)
    total_iteration = sum(r["time/iteration"] for r in records)
    summary["first_iteration_s"] = records[0]["time/iteration"]
    summary["seconds_per_iteration"] = median_iteration
    for phase in PHASES:
        summary[f"{phase}_share"] = statistics.median(r[f"time/{phase}"] for r in timed) / median_iteration
        summary[f"{phase}_share_of_run"] = sum(r[f"time/{phase}"] for r in records) / total_iteration
    summary["learn_sync_share"] = summary["learn_share"] + summary["sync_share"]
    summary["reward_first_fifth"], summary["reward_last_fifth"] = first_and_last_fifth(
        [r["reward/mean"] for r in records]
    )
    return summary


def quickstart(time_box_s: float = QUICKSTART_TIME_BOX_S) -> dict[str, Any]:
    repo = pathlib.Path(__file__).resolve().parents[2]
    planned = int(flagfile_value(repo / QUICKSTART_CONFIG, "iterations"))
    environment = {host_memory.SETTING_VARIABLE: "0", **os.environ}
    with tempfile.TemporaryDirectory() as logdir:
        command = [sys.executable, "-m", "launch.train", f"--flagfile={QUICKSTART_CONFIG}", f"--logdir={logdir}",
                   "--generator_device=cuda"]  # fmt: skip
        start = time.perf_counter()
        try:
            result = subprocess.run(command, cwd=repo, env=environment, capture_output=True, text=True,
                                    timeout=time_box_s)  # fmt: skip
            exit_code, stderr = result.returncode, result.stderr
        except subprocess.TimeoutExpired as stopped:
            exit_code, stderr = None, stopped.stderr.decode(errors="replace") if stopped.stderr else ""
        wall_s = time.perf_counter() - start
        records = read_metrics(logdir) if (pathlib.Path(logdir) / "metrics.jsonl").exists() else []
    summary = {"config": QUICKSTART_CONFIG, "generator_device": "cuda", "learner_device": str(jax.devices()[0]),
               "wall_s": wall_s, "exit_code": exit_code, "time_box_s": time_box_s,
               **summarize_quickstart(records, planned)}  # fmt: skip
    if exit_code != 0:
        summary["stderr_tail"] = stderr[-3000:]
    return summary


def learner_update(profile_dir: str | None = None) -> dict[str, Any]:
    """The accelerator update, with its kernel table from one more update traced under `profile_dir` (a temporary
    directory when None)."""
    with tempfile.TemporaryDirectory() as scratch:
        report = learner_suite.accelerator_update(
            learner_suite.QWEN25_1_5B, **learner_suite.ACCELERATOR_SHAPE, profile_dir=profile_dir or scratch
        )
    return {"model": "Qwen2.5-1.5B-shaped, random weights", **learner_figures(report)}


def learner_options(time_box_s: float) -> dict[str, Any]:
    """The accelerator update under each of `LEARNER_OPTIONS` (changes to the suite's shape or the model's
    attention), while at least `LEARNER_OPTION_S` of `time_box_s` is left; the figures of each, keyed by option."""
    start = time.perf_counter()
    figures: dict[str, Any] = {}
    for option in LEARNER_OPTIONS:
        name = ",".join(f"{key}={value}" for key, value in option.items())
        if time_box_s - (time.perf_counter() - start) < LEARNER_OPTION_S:
            figures[name] = {"skipped": f"under {LEARNER_OPTION_S} s of the {time_box_s:.0f} s time box left"}
            continue
        shape = {**learner_suite.ACCELERATOR_SHAPE, **{k: v for k, v in option.items() if k in ("micro_batch",)}}
        model = {k: v for k, v in option.items() if k not in shape}
        try:
            report = learner_suite.accelerator_update(learner_suite.QWEN25_1_5B, **shape, **model)
            figures[name] = learner_figures(report)
        except Exception as error:  # one option failing (cuDNN refusing a shape, say) must not hide the others
            traceback.print_exc()
            figures[name] = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps({"learner_option": name, **figures[name]}, sort_keys=True, default=str), flush=True)
    return figures


def learner_figures(accelerator_report: Report) -> dict[str, Any]:
    """The learner suite's accelerator figures, with the median and fastest update and its note."""
    (row,) = accelerator_report.rows
    figures = {name: value for name, value in accelerator_report.figures.items() if name != "model_shape"}
    return {**figures, "median_s": row[1], "min_s": row[2], "note": accelerator_report.notes[0]}


def weight_sync(hf_config: Mapping[str, Any] = learner_suite.QWEN25_1_5B, device: str = "cuda",
                repeats: int = sync_suite.REPEATS) -> dict[str, Any]:  # fmt: skip
    """In-process sync of a Flax model shaped by `hf_config` (float32 weights) into a TorchGenerator on `device`
    holding random weights of the same shape, in each of `SYNC_DTYPES`, against a copy of the same bytes there."""
    model = Transformer(ModelConfig.from_hf(dict(hf_config), param_dtype="float32"), rngs=nnx.Rngs(0))
    figures: dict[str, Any] = {}
    for dtype in SYNC_DTYPES:
        torch_dtype = getattr(torch, dtype)
        with torch.device(device):
            hf_model = transformers.AutoModelForCausalLM.from_config(
                transformers.AutoConfig.for_model(**hf_config), dtype=torch_dtype
            )
        generator = TorchGenerator(hf_model, device=device, dtype=torch_dtype)
        cast = None if dtype == "float32" else jnp.dtype(dtype)
        sync_s, memcpy_s, total_bytes = sync_suite.in_process_seconds(model, generator, dtype=cast, repeats=repeats)
        generator.close()
        del hf_model
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
        figures[dtype] = {"bytes": total_bytes, "sync_s": statistics.median(sync_s),
                          "memcpy_s": statistics.median(memcpy_s),
                          "sync_over_memcpy": statistics.median(sync_s) / statistics.median(memcpy_s)}  # fmt: skip
    return {"model_shape": hf_config.get("model_type"), "device": device, "repeats": repeats, **figures}


def _part_functions(profile_dir: str | None, options_time_box_s: float) -> dict[str, Callable[[], dict[str, Any]]]:
    return {
        "quickstart": quickstart,
        "learner": lambda: learner_update(profile_dir),
        "sync": weight_sync,
        "learner_options": lambda: learner_options(options_time_box_s),
    }


def _run_part(name: str, function: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        figures = function()
    except Exception as error:  # a failed part must not cost the lease the others' figures
        traceback.print_exc()
        figures = {"error": f"{type(error).__name__}: {error}"}
    figures["part_s"] = time.perf_counter() - start
    print(json.dumps({"gpu_part": name, **figures}, sort_keys=True, default=str), flush=True)
    return figures


def report(found: Mapping[str, Any], parts: Mapping[str, Mapping[str, Any]], suite_s: float) -> Report:
    """The table (one row per figure) and the JSON figures of the parts that ran."""
    rows: list[Sequence[Any]] = []
    notes = []
    for name, figures in parts.items():
        if "error" in figures:
            rows.append((name, "FAILED", figures["error"]))
            continue
        if name == "quickstart":
            done = f"{figures['iterations']} of {figures['iterations_planned']}"
            if figures["exit_code"] is None:
                done += f" (stopped at its {figures['time_box_s']:.0f} s time box)"
            elif figures["exit_code"] != 0:
                done += f" (exit code {figures['exit_code']})"
            rows.append((name, "iterations", done))
            rows.append((name, "wall_s (start, warm-start, iterations, final checks)", figures["wall_s"]))
            if figures["iterations"]:
                rows.append((name, "first iteration s (compiles)", figures["first_iteration_s"]))
                rows.append((name, "median iteration s (after the first)", figures["seconds_per_iteration"]))
                rows.extend((name, f"{phase} share: median / of the run",
                             f"{figures[f'{phase}_share']:.3f} / {figures[f'{phase}_share_of_run']:.3f}")
                            for phase in PHASES)  # fmt: skip
                rows.append((name, f"learn + sync share, median (e2e goal <= {GOAL_LEARN_SYNC_SHARE:.0%})",
                             figures["learn_sync_share"]))  # fmt: skip
                rows.append((name, "reward: first fifth -> last fifth",
                             f"{figures['reward_first_fifth']:.3f} -> {figures['reward_last_fifth']:.3f}"))  # fmt: skip
        elif name == "learner_options":
            for option, option_figures in figures.items():
                if option == "part_s":
                    continue
                if "flax_mfu" not in option_figures:
                    rows.append((name, option, option_figures.get("error") or option_figures.get("skipped")))
                    continue
                rows.append((name, f"{option}: update s (median) / MFU",
                             f"{option_figures['median_s']:.4f} / {option_figures['flax_mfu']:.3f}"))  # fmt: skip
        elif name == "learner":
            rows.append((name, "bf16 update s (median)", figures["median_s"]))
            rows.append((name, "tokens/s", figures["flax_tokens_per_s"]))
            rows.append((name, "MFU (vs measured bf16 matmul)", figures["flax_mfu"]))
            rows.append((name, "bf16 matmul TFLOP/s (measured)", figures["bf16_matmul_tflops_per_s"]))
            rows.extend((name, f"kernel time share: {kind}", f"{share['share']:.3f}")
                        for kind, share in figures.get("kernels", {}).get("by_kind", {}).items())  # fmt: skip
            notes.append(figures["note"])
        elif name == "sync":
            for dtype in SYNC_DTYPES:
                rows.append((name, f"{dtype} sync s (median)", figures[dtype]["sync_s"]))
                rows.append((name, f"{dtype} sync / memcpy of its {figures[dtype]['bytes']:,} bytes",
                             figures[dtype]["sync_over_memcpy"]))  # fmt: skip
    notes.append(f"suite: {suite_s:.0f} s (goal < {GOAL_SUITE_SECONDS} s)")
    return Report(
        suite="gpu",
        columns=("part", "figure", "value"),
        rows=rows,
        figures={"gpu": found.get("torch_cuda_device"), "devices": dict(found), **parts, "suite_s": suite_s,
                 "goal_suite_s_max": GOAL_SUITE_SECONDS, "goal_met": suite_s < GOAL_SUITE_SECONDS},  # fmt: skip
        notes=notes,
    )


def run(parts: Sequence[str] = PARTS, profile_dir: str | None = None, options_time_box_s: float = 300.0) -> Report:
    """The `parts` (of `PARTS` and `OPTIONAL_PARTS`) in that order; the learner part's trace goes to `profile_dir`
    (a temporary directory when None)."""
    start = time.perf_counter()
    if not any(name in os.environ for name in JAX_ALLOCATOR_VARIABLES):
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # read when JAX's backend starts, just below
    found = devices_found()
    line = missing_gpu(found)
    if line is not None:
        return Report(
            suite="gpu",
            columns=("check", "found"),
            rows=[("jax.devices()", found["jax_devices"]),
                  ("torch.cuda.is_available()", found["torch_cuda_available"])],
            figures={"gpu": None, "devices": found},
            notes=[line],
        )
    known = PARTS + OPTIONAL_PARTS
    unknown = sorted(set(parts) - set(known))
    if unknown:
        raise ValueError(f"unknown parts {unknown}; the parts are {known}")
    functions = _part_functions(profile_dir, options_time_box_s)
    results = {name: _run_part(name, functions[name]) for name in known if name in parts}
    return report(found, results, time.perf_counter() - start)


def prepare(directory: str | os.PathLike) -> None:
    """Writes what a lent GPU machine lacks for this suite to `directory`: SmolLM2's tokenizer as a model cache
    (`XDG_CACHE_HOME=directory` there) and, under `wheels/`, the wheels of `gpu_requirements.txt` for its python3."""
    directory = pathlib.Path(directory)
    tokenizer = zoo.copy_tokenizer(directory)
    wheels = directory / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)  # a stale second version of a package would stop the install there
    platforms = [argument for platform in DEVICE_PLATFORMS for argument in ("--platform", platform)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version",
         DEVICE_PYTHON, "--implementation", "cp", *platforms, "--dest", str(wheels), "-r", str(REQUIREMENTS)],
        check=True,
    )  # fmt: skip
    size = sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())
    print(f"{tokenizer} and {len(list(wheels.glob('*.whl')))} wheels in {wheels}: {size / 1e6:.1f} MB in {directory}")


def _prepare_main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise app.UsageError("usage: python -m launch.benchmark_suites.gpu DIRECTORY (for example .cache-gpu)")
    prepare(argv[1])


if __name__ == "__main__":
    app.run(_prepare_main)
