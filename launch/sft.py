"""Supervised format warm-start of the Conductor: `python -m launch.sft [--flags]`.

Fits the Conductor to a teacher's workflows (`--warm_start_teacher`: `conductor.teachers`) for `--warm_start_steps` steps
(`conductor.warm_start`). Before and after, it samples the Conductor on a few questions and reports the fraction of
completions that parse as workflows. The result is an HF directory (`--logdir`) that `--conductor` accepts.
`launch.train --warm_start_steps=N` runs the same warm-start in-process.

`--warm_start_task_probe_weight` > 0 trains, beside the likelihood, a linear probe (discarded afterwards) that
predicts the question's task from the hidden state where the first worker id is chosen (see `rl.supervised`): the
student still routes uniformly, but its decision state carries the task, so RL can learn per-task routing from
there.

Launched on several hosts as one job (`conductor/distributed.py`), every process fits the same examples on one device
of its own (the supervised trainer has no mesh; a warm-start is small), the processes take process 0's result, and
process 0 writes it.
"""

from __future__ import annotations

from conductor.host_memory import retain_freed_memory

# First, before JAX and torch start their threads; run as a program, restart with glibc tunables
# (conductor/host_memory.py).
retain_freed_memory(restart=__name__ == "__main__")

import json
import logging

from absl import app, flags

from conductor import console, distributed
from conductor.conductor_env import build_env
from conductor.generators import build_generator, share_gpu_with_torch_generator
from conductor.loop_environment import TokenizedConductorEnv
from conductor.model import load_conductor, save_trained_sampling
from conductor.teachers import task_label_indices
from conductor.warm_start import format_validity, warm_start
from launch.flag_groups import compilation as compilation_flags
from launch.flag_groups import conductor as conductor_flags
from launch.flag_groups import console as console_flags
from launch.flag_groups import distributed as distributed_flags
from launch.flag_groups import environment as environment_flags
from launch.flag_groups import generator as generator_flags
from launch.flag_groups import output as output_flags
from launch.flag_groups import sampling as sampling_flags
from launch.flag_groups import supervised as supervised_flags
from launch.flag_groups import teacher as teacher_flags
from models import hf_io
from rl.compiles import use_persistent_cache

_VALIDITY_SAMPLES = flags.DEFINE_integer(
    "warm_start_validity_samples", 32, "Samples drawn to measure format validity."
)

log = logging.getLogger(__name__)


def main(argv: list[str]) -> None:
    del argv
    console.configure(console_flags.LIBRARY_LOGS.value)
    processes = distributed_flags.from_flags()
    distributed.initialize(processes)
    use_persistent_cache(compilation_flags.from_flags())  # before the first compile
    out = output_flags.logdir("runs/sft/conductor")  # the warm-started Conductor, an HF dir
    steps = supervised_flags.steps(default=100)
    generation = generator_flags.from_flags()
    share_gpu_with_torch_generator(generation)  # before JAX's first computation
    model, tokenizer, model_dir = load_conductor(conductor_flags.from_flags(), distributed.process_dir(out) / "init")
    # Validity is measured at the sampling settings RL will use (--temperature, --top_p, --top_k, --max_tokens).
    params = sampling_flags.from_flags()
    world = TokenizedConductorEnv(build_env(environment_flags.from_flags()), tokenizer, sampling_flags.token_masks(),
                                  params.max_new_tokens)
    generator, sync = build_generator(generation, model_dir, distributed.process_dir(out))
    probe = list(range(min(8, world.num_questions)))
    before = format_validity(generator, world, probe, _VALIDITY_SAMPLES.value, params)
    log.info("valid workflows before warm-start: %.1f%% (temperature %g)", 100 * before, params.temperature)
    trainer = supervised_flags.from_flags(steps, len(task_label_indices(world)))
    history = warm_start(model, world, steps, trainer, teacher_flags.from_flags())
    distributed.share_process_zero_weights(model)
    sync(model, 1)
    after = format_validity(generator, world, probe, _VALIDITY_SAMPLES.value, params)
    log.info("valid workflows after %d steps: %.1f%%", steps, 100 * after)
    if not distributed.is_main_process():
        generator.close()
        return
    hf_io.save(model, out)
    tokenizer.save_pretrained(out)
    # Its format was checked at these settings, so eval and serve sample it at them (launch.flag_groups.sampling).
    save_trained_sampling(out, params, world.env.config.conductor_prompt)
    generator.close()
    print(json.dumps({"valid_before": before, "valid_after": after, "temperature": params.temperature,
                      "final_nll": history[-1]["nll"], "steps": steps, "out": str(out)}))


if __name__ == "__main__":
    app.run(main)
