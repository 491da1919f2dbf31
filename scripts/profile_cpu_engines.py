"""Per-op CPU profile of the benchmark steps in both engines, on the same inputs: where XLA:CPU and torch spend a
step's time, grouped the same way on both sides (matmuls by shape, reductions, elementwise passes, copies).

    python scripts/profile_cpu_engines.py --step=forward            # launch/benchmark_suites/forward.py's call
    python scripts/profile_cpu_engines.py --step=update             # launch/benchmark_suites/learner.py's headline update
    python scripts/profile_cpu_engines.py --step=forward --threads=1 --engines=jax
    XLA_FLAGS=--xla_cpu_... python scripts/profile_cpu_engines.py --step=forward --engines=jax

XLA's side is a `jax.profiler` trace of the compiled call: each op XLA:CPU's runtime ran, named back to its HLO
instruction (shape, and the JAX operation it came from) through an after-optimisation HLO dump. Torch's side is
`torch.profiler` self time per op and input shapes. `--threads` pins the process to that many cores before either
library starts (both size their thread pools from the affinity mask).

XLA runs independent ops at once, so its op times add up to more than the call's wall time; the wall-time table
splits each stretch of time evenly among the ops running in it, which makes it comparable with torch's table (torch
runs one op at a time). A plain `dot:` op is a dot XLA hands to Eigen, which runs it asynchronously: its event covers
only the launch, and its time shows as the difference between the wall time and the time with an op running.
"""

from launch import host_memory

host_memory.retain_freed_memory(restart=True)

import argparse  # noqa: E402
import collections  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--step", choices=("forward", "update"), default="forward")
parser.add_argument("--threads", type=int, default=0, help="cores to pin to (0: all this process may use)")
parser.add_argument("--engines", default="jax,torch", help="comma-separated: jax, torch")
parser.add_argument("--calls", type=int, default=2, help="profiled calls per engine, after the untimed ones")
parser.add_argument("--top", type=int, default=25)
args = parser.parse_args()
if args.threads:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.threads])
DUMP = pathlib.Path(tempfile.mkdtemp(prefix="xla_dump_"))
# The after-optimisation HLO names each op of the trace.
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={DUMP} --xla_dump_hlo_as_text"

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from launch.benchmark_suites import forward as forward_suite  # noqa: E402
from launch.benchmark_suites import learner as learner_suite  # noqa: E402
from models import hf_io, zoo  # noqa: E402
from rl.learner import Learner  # noqa: E402

INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\S+?)(?:\{[^}]*\})? (\S+?)\((.*)$")
OP_NAME = re.compile(r'op_name="([^"]*)"')


def hlo_instructions(module_name: str) -> dict[str, str]:
    """Instruction name -> "what it computes [shape]" from the dump of `module_name` after optimisation."""
    dumps = sorted(DUMP.glob(f"*.{module_name}.cpu_after_optimizations.txt"))
    labels = {}
    for line in dumps[-1].read_text().splitlines() if dumps else []:
        match = INSTRUCTION.match(line)
        if not match:
            continue
        name, shape, opcode, rest = match.groups()
        op_name = OP_NAME.search(rest)
        # The JAX operation without the jit(...) prefix: jvp(...)/transpose(...) wrappers say forward or backward.
        source = op_name.group(1).split("/", 1)[-1] if op_name else opcode
        if "kind=kCustom" in rest:
            source = f"{name.split('.')[0]}: {source}"
        elif opcode == "dot":
            # A dot XLA:CPU runs itself (Eigen); its op_name may be a transpose that was folded into it.
            source = f"dot: {source}"
        labels[name] = f"{source} {shape}"
    return labels


def kind_of(label: str) -> str:
    if "dot" in label or "->" in label:
        return "matmul"
    if "reduce" in label or "logsumexp" in label or "softmax" in label:
        return "reduction"
    if "copy" in label or "transpose" in label:
        return "copy/transpose"
    return "elementwise/other"


def print_table(title: str, seconds: dict[str, float], calls: dict[str, int], per: int) -> None:
    total = sum(seconds.values())
    by_kind: dict[str, float] = collections.defaultdict(float)
    for label, value in seconds.items():
        by_kind[kind_of(label)] += value
    print(f"\n== {title}: {total / per * 1e3:.1f} ms per call ==")
    for kind, value in sorted(by_kind.items(), key=lambda item: -item[1]):
        print(f"  {kind:20s} {value / per * 1e3:9.1f} ms  {value / total:6.1%}")
    for label, value in sorted(seconds.items(), key=lambda item: -item[1])[: args.top]:
        print(f"  {value / per * 1e3:9.1f} ms {calls[label] // per:4d}x  {label[:150]}")


def profile_jax(step) -> None:
    step()
    step()
    start = time.perf_counter()
    step()
    step_seconds = time.perf_counter() - start
    print(f"jax: one call {step_seconds:.3f} s wall")
    directory = DUMP / "trace"
    with jax.profiler.trace(str(directory)):
        for _ in range(args.calls):
            step()
    trace = sorted(directory.rglob("*.xplane.pb"))[-1]
    events = []
    for plane in jax.profiler.ProfileData.from_file(str(trace)).planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_op" in stats:
                    events.append((str(stats["hlo_module"]), str(stats["hlo_op"]), event.start_ns, event.end_ns))
    # The step's own program is the one that ran longest (an update also runs small jitted helpers).
    time_by_module: dict[str, float] = collections.Counter()
    for module, _, start, end in events:
        time_by_module[module] += end - start
    module_name = max(time_by_module, key=time_by_module.get)
    labels = hlo_instructions(module_name)
    intervals = [(start, end, labels.get(op, op)) for module, op, start, end in events if module == module_name]
    calls = collections.Counter(label for _, _, label in intervals)
    print_table(f"XLA:CPU, {module_name}, op time (concurrent ops overlap)", _op_seconds(intervals), calls, args.calls)
    wall = _wall_seconds(intervals)
    print_table(f"XLA:CPU, {module_name}, wall time (shared among the ops running at once)", wall, calls, args.calls)
    if args.step == "update":
        # Autodiff names the forward's ops jvp(...) and the backward's transpose(jvp(...)); the rest is the optimizer.
        phases: dict[str, float] = collections.defaultdict(float)
        for label, seconds in wall.items():
            phase = "backward" if "transpose(jvp" in label else "forward" if "jvp(" in label else "optimizer, other"
            phases[phase] += seconds
        busy = sum(phases.values())
        print(f"\n== wall time by phase: {busy / args.calls * 1e3:.1f} ms with an op running, of {step_seconds:.3f} s ==")
        for phase, seconds in sorted(phases.items(), key=lambda item: -item[1]):
            print(f"  {phase:20s} {seconds / args.calls * 1e3:9.1f} ms")
        other = {label: seconds for label, seconds in wall.items() if "jvp(" not in label}
        print_table(f"XLA:CPU, {module_name}, optimizer and other ops", other, calls, args.calls)


def _op_seconds(intervals) -> dict[str, float]:
    seconds: dict[str, float] = collections.defaultdict(float)
    for start, end, label in intervals:
        seconds[label] += (end - start) * 1e-9
    return seconds


def _wall_seconds(intervals) -> dict[str, float]:
    """Each stretch of wall time split evenly among the ops running during it: the table sums to the time at least
    one op ran, comparable with torch's ops, which run one at a time."""
    boundaries = sorted({t for start, end, _ in intervals for t in (start, end)})
    starting = collections.defaultdict(list)
    for index, (start, _, _) in enumerate(intervals):
        starting[start].append(index)
    seconds: dict[str, float] = collections.defaultdict(float)
    running: set[int] = set()
    for left, right in zip(boundaries[:-1], boundaries[1:]):
        running = {i for i in running if intervals[i][1] > left} | set(starting[left])
        for index in running:
            seconds[intervals[index][2]] += (right - left) * 1e-9 / len(running)
    return seconds


def profile_torch(step) -> None:
    step()
    step()
    start = time.perf_counter()
    step()
    print(f"torch: one call {time.perf_counter() - start:.3f} s wall, {torch.get_num_threads()} threads")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as profile:
        for _ in range(args.calls):
            step()
    seconds: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, int] = collections.Counter()
    for event in profile.key_averages(group_by_input_shape=True):
        if event.self_cpu_time_total <= 0:
            continue
        shapes = ",".join(str(list(shape)) for shape in event.input_shapes if shape)
        label = f"{event.key} {shapes}"
        if event.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"):
            label = f"dot_general {label}"
        seconds[label] += event.self_cpu_time_total * 1e-6
        calls[label] += event.count
    print_table("torch eager", seconds, calls, args.calls)


def main() -> None:
    engines = args.engines.split(",")
    model_dir = zoo.smollm2_135m_instruct()
    print(f"{args.step}: {len(os.sched_getaffinity(0))} cores; XLA_FLAGS={os.environ['XLA_FLAGS']}")
    if args.step == "forward":
        tokens = forward_suite.benchmark_tokens()
        if "jax" in engines:
            profile_jax(forward_suite.flax_forward_call(model_dir, tokens))
        if "torch" in engines:
            profile_torch(forward_suite.torch_forward_call(model_dir, tokens))
        return
    shape = dict(batch=learner_suite.BATCH, prompt=learner_suite.PROMPT, completion=learner_suite.COMPLETION,
                 vocab=49152, groups=learner_suite.GROUPS)  # fmt: skip
    batch, advantages = learner_suite._random_batch(**shape, shared_prompts=False)
    if "jax" in engines:
        learner = Learner(hf_io.load(model_dir), learner_suite._learner_config())
        profile_jax(lambda: jax.block_until_ready(learner.update(batch)))
        del learner
    if "torch" in engines:
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=learner_suite.LEARNING_RATE, weight_decay=0.0)
        inputs = (
            torch.as_tensor(np.asarray(batch.tokens), dtype=torch.long),
            torch.as_tensor(np.asarray(batch.attention_mask), dtype=torch.long),
            torch.as_tensor(np.asarray(batch.loss_mask), dtype=torch.float32),
            torch.as_tensor(advantages),
        )
        profile_torch(lambda: learner_suite._torch_step(model, optimizer, *inputs))


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(DUMP, ignore_errors=True)
