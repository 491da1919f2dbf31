"""GRPO training of the Conductor: `python -m launch.train --flagfile=launch/configs/quickstart.cfg`.

Builds the world (`--world`), the Conductor (`--conductor`, optionally warm-started with `--warm_start_steps`), the
generator and its weight sync (`--generator`, `--sync`), the learner (estimator, loss, optimizer flags) and runs
`rl.loop.TrainingLoop`. Writes TensorBoard events, metrics.jsonl and rollouts.jsonl to `--logdir`, checkpoints to
`--checkpoint_dir` (default `<logdir>/checkpoints`), and the trained Conductor as an HF directory to
`<logdir>/conductor_final` (what `launch.eval` and `launch.serve` take as `--conductor`). Rerunning the same
command resumes from the last checkpoint. With `--selection_tasks` the final Conductor is the run's state that scored
best on those held-out questions (after the warm-start or at a checkpoint; `rl.selection`), not its last one.

Several hosts run it as one job (`conductor/distributed.py`: `--coordinator_address`, `--num_processes`,
`--process_id`, or a TPU pod, SLURM or Open MPI): one process per host, the learner's mesh over every host's devices,
each process sampling its share of every iteration's questions (`rl.loop`). Process 0 writes the logs, the final
Conductor and the summary; every process writes its part of each checkpoint, into the one `--checkpoint_dir`.
"""

from __future__ import annotations

from conductor.host_memory import retain_freed_memory

# First, before JAX and torch start their threads; run as a program, restart with glibc tunables
# (conductor/host_memory.py).
retain_freed_memory(restart=__name__ == "__main__")

import dataclasses
import json
import logging
import pathlib
from typing import Any

from absl import app, flags
from flax import nnx

from conductor import console, distributed
from conductor.baselines import orchestration_figures, recorded_figures
from conductor.conductor_env import build_env
from conductor.format_check import greedy_valid_format, held_out_questions
from conductor.generators import build_generator, share_gpu_with_torch_generator
from conductor.loop_environment import TokenizedConductorEnv
from conductor.model import load_conductor, save_trained_sampling
from conductor.outcomes import conductor_outcomes
from conductor.report import summarize
from conductor.teachers import task_label_indices
from conductor.warm_start import cached_warm_start, warm_start, warm_start_origin
from launch.flag_groups import compilation as compilation_flags
from launch.flag_groups import conductor as conductor_flags
from launch.flag_groups import console as console_flags
from launch.flag_groups import distributed as distributed_flags
from launch.flag_groups import environment as environment_flags
from launch.flag_groups import generator as generator_flags
from launch.flag_groups import learner as learner_flags
from launch.flag_groups import loop as loop_flags
from launch.flag_groups import output as output_flags
from launch.flag_groups import sampling as sampling_flags
from launch.flag_groups import supervised as supervised_flags
from launch.flag_groups import teacher as teacher_flags
from models import hf_io
from models.lora import save_peft_adapter
from rl.checkpoint import Checkpointer
from rl.compiles import use_persistent_cache
from rl.learner import Learner
from rl.loop import TrainingLoop
from rl.metrics import MetricsWriter, first_and_last_fifth, read_metrics
from rl.selection import BestCheckpoint
from rollout.types import Generator, SamplingParams
from sweeps.stats import summary_value

_MESH_FSDP = flags.DEFINE_integer(
    "mesh_fsdp", 1, "Devices on the fsdp mesh axis, counted over all processes (fsdp x tp: all of them, multi-host)."
)
_MESH_TP = flags.DEFINE_integer("mesh_tp", 1, "Devices on the tensor-parallel mesh axis, counted over all processes.")
# -- run bookkeeping ---------------------------------------------------------------------------------------------------
_CHECKPOINT_DIR = flags.DEFINE_string("checkpoint_dir", None, "Checkpoints (default: <logdir>/checkpoints).")
_KEEP = flags.DEFINE_integer("keep_checkpoints", 3, "Checkpoints kept.")
_RESUME = flags.DEFINE_boolean("resume", True, "Resume from the latest checkpoint when one exists.")
_EVAL_TASKS = flags.DEFINE_list(
    "eval_tasks", [],
    "Held-out task files evaluated after training (greedy): the summary's eval (with --selection_tasks, of the "
    "selected weights; the last ones' in last_eval).",
)
_FORMAT_CHECK_QUESTIONS = flags.DEFINE_integer(
    "format_check_questions", 64,
    "Questions the trained Conductor answers greedily at the end, as launch.eval and launch.serve first decode it; "
    "the fraction whose workflow parses is the summary's greedy_valid_format. Fresh questions on a synthetic task "
    "set, else a sample of the training questions (0: no check).",
    lower_bound=0,
)
_SELECTION_TASKS = flags.DEFINE_list(
    "selection_tasks", [],
    "Held-out task files that choose the run's final weights: the Conductor answers them greedily after the "
    "warm-start and at every checkpoint (--checkpoint_every), and the state that scores best on --selection_score "
    "(the earlier on a tie) becomes conductor_final, the one --eval_tasks evaluates (kept in <logdir>/selection; a "
    "checkpoint whose scoring a kill interrupted stays unscored on resume). Empty: the last weights.",
)
_SELECTION_SCORE = flags.DEFINE_string(
    "selection_score", "average.reward",
    "The figure of the greedy evaluation on --selection_tasks that the run maximises: a dotted key of its summary "
    "(as the summary's eval has it, e.g. gap_closed on the orchestration world).",
)
flags.register_multi_flags_validator(
    ["selection_tasks", "eval_tasks"],
    lambda values: not set(values["selection_tasks"]) & set(values["eval_tasks"]),
    "--selection_tasks and --eval_tasks share a task file: the evaluation would report the score that chose the "
    "weights; choose them on another split",
)
_EVAL_WARM_START = flags.DEFINE_boolean(
    "eval_warm_start", False,
    "Also evaluate --eval_tasks greedily after the warm-start, before RL: the summary's warm_start_eval, beside its "
    "eval (kept in <logdir>/warm_start_eval.json, so a resumed run still reports it).",
)
flags.register_multi_flags_validator(
    ["eval_warm_start", "eval_tasks", "warm_start_steps"],
    lambda values: not values["eval_warm_start"] or bool(values["eval_tasks"] and values["warm_start_steps"]),
    "--eval_warm_start evaluates the warm-start on --eval_tasks: give both --eval_tasks and --warm_start_steps",
)

log = logging.getLogger(__name__)


def greedy_eval(generator: Generator, tokenizer: Any, sampling: SamplingParams, eval_env: Any) -> dict[str, Any]:
    """The greedy evaluation on `eval_env`'s questions, with the Conductor's own completion limit: a default one would
    hold a non-stopping small Conductor for 1024 steps."""
    environment = TokenizedConductorEnv(eval_env, tokenizer, sampling_flags.token_masks(), sampling.max_new_tokens)
    outcomes = conductor_outcomes(generator, environment, dataclasses.replace(sampling, temperature=0.0), repeats=1)
    summary = summarize(outcomes, [worker.name for worker in eval_env.world.pool])
    if eval_env.world.orchestration is not None:
        summary.update(orchestration_figures(eval_env.world.orchestration, eval_env.world.tasks, outcomes))
    if eval_env.world.name == "zeroeval":
        summary.update(recorded_figures(eval_env.world, outcomes))
    return summary


@dataclasses.dataclass
class Selection:
    """--selection_tasks: the held-out questions that score the policy and the best state kept so far."""

    best: BestCheckpoint
    env: Any
    score_key: str

    def consider(self, iteration: int, loop: TrainingLoop, generator: Generator, tokenizer: Any,
                 sampling: SamplingParams) -> None:
        """Scores the generator's current weights (those of `iteration`) and keeps the learner's state if best."""
        if iteration in self.best.scores:
            return  # a run of no iterations saves its start, already scored after the warm-start
        score = float("nan")
        if distributed.is_main_process():
            evaluation = greedy_eval(generator, tokenizer, sampling, self.env)
            value = summary_value(evaluation, self.score_key)
            if value is None:
                log.error("--selection_score=%s: the greedy evaluation has no such figure; its keys: %s",
                          self.score_key, ", ".join(sorted(evaluation)))
            score = float("nan") if value is None else value
        score = distributed.main_process_value(score)
        if score != score:  # every process stops alike
            raise SystemExit(f"--selection_score={self.score_key} is not a figure of the greedy evaluation on "
                             "--selection_tasks (process 0 logged its keys)")
        kept = self.best.consider(iteration, score, loop.learner, loop.rng_key, loop.loop_state())
        log.info("selection: iteration %d scores %s %.4f%s", iteration, self.score_key, score,
                 ", the best so far" if kept else "")


def main(argv: list[str]) -> None:
    del argv
    console.configure(console_flags.LIBRARY_LOGS.value)
    processes = distributed_flags.from_flags()
    distributed.initialize(processes)
    use_persistent_cache(compilation_flags.from_flags())  # before the first compile
    log_dir = output_flags.logdir("runs/train")
    warm_start_steps = supervised_flags.steps(default=0)
    checkpoint_dir = pathlib.Path(_CHECKPOINT_DIR.value or log_dir / "checkpoints")
    if not _RESUME.value and checkpoint_dir.exists() and any(checkpoint_dir.iterdir()):
        raise SystemExit(f"{checkpoint_dir} holds checkpoints and --noresume was given; choose a new --logdir")

    generation = generator_flags.from_flags()
    share_gpu_with_torch_generator(generation)  # before JAX's first computation
    conductor_spec, env_spec = conductor_flags.from_flags(), environment_flags.from_flags()
    model, tokenizer, model_dir = load_conductor(conductor_spec, distributed.process_dir(log_dir) / "conductor_init")
    env = build_env(env_spec)
    sampling = sampling_flags.from_flags()
    environment = TokenizedConductorEnv(env, tokenizer, sampling_flags.token_masks(), sampling.max_new_tokens)
    checkpointer = Checkpointer(checkpoint_dir, keep=_KEEP.value)
    fresh_run = checkpointer.latest_step() is None
    eval_spec = environment_flags.from_flags(_EVAL_TASKS.value) if _EVAL_TASKS.value else None
    selection = Selection(
        BestCheckpoint(log_dir / "selection", write_scores=distributed.is_main_process()),
        build_env(environment_flags.from_flags(_SELECTION_TASKS.value)), _SELECTION_SCORE.value,
    ) if _SELECTION_TASKS.value else None
    # LoRA checkpoints hold the adapters alone: a resumed run needs the base they adapt, and a warm-started base
    # exists nowhere but here, so it is written once and read back on resume.
    lora = learner_flags.lora_from_flags(seed=0)
    lora_base_dir = log_dir / "lora_base" if lora.enabled and warm_start_steps else model_dir
    if warm_start_steps and fresh_run:
        trainer = supervised_flags.from_flags(warm_start_steps, len(task_label_indices(environment)))
        teacher = teacher_flags.from_flags()
        if supervised_flags.CACHE_DIR.value:
            cached_warm_start(model, environment, warm_start_steps, trainer, teacher,
                              warm_start_origin(conductor_spec, env_spec, teacher),
                              pathlib.Path(supervised_flags.CACHE_DIR.value))
        else:
            warm_start(model, environment, warm_start_steps, trainer, teacher)
    distributed.share_process_zero_weights(model)
    if lora_base_dir != model_dir and fresh_run and distributed.is_main_process():
        hf_io.save(model, lora_base_dir)  # whole on every process until the learner shards it
        tokenizer.save_pretrained(lora_base_dir)
    elif lora_base_dir != model_dir and not fresh_run:
        config = model.config
        base = hf_io.load(lora_base_dir, dtype=config.dtype, param_dtype=config.param_dtype, remat=config.remat)
        nnx.update(model, nnx.state(base, nnx.Param))

    generator, weight_sync = build_generator(generation, model_dir, distributed.process_dir(log_dir))
    mesh = distributed.learner_mesh(_MESH_FSDP.value, _MESH_TP.value)
    loop_config = loop_flags.from_flags(env.config.recursion_rounds)
    # --steady_shapes starts the learner's row length at the longest first-round prompt of the questions it trains on.
    longest_prompt = max(map(len, map(environment.prompt_ids, range(environment.num_questions)))) if (
        learner_flags.steady_shapes()) else 0
    learner = Learner(
        model, learner_flags.from_flags(loop_config, sampling, environment.route_token_ids, longest_prompt), mesh=mesh
    )
    writer = MetricsWriter(log_dir) if distributed.is_main_process() else None
    loop = TrainingLoop(
        loop_config,
        learner=learner,
        sampler=generator,
        sampling_params=sampling,
        weight_sync=weight_sync,
        environment=environment,
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        writer=writer,
        checkpointer=checkpointer,
    )
    if selection is not None:
        loop.after_checkpoint = lambda iteration: selection.consider(iteration, loop, generator, tokenizer, sampling)
    if fresh_run and (_EVAL_WARM_START.value or selection is not None):
        weight_sync(learner.model, loop.policy_version)  # the generator was built from the weights before it
    if fresh_run and selection is not None:
        selection.consider(0, loop, generator, tokenizer, sampling)
    warm_start_eval_path = log_dir / "warm_start_eval.json"
    if _EVAL_WARM_START.value:
        if fresh_run:
            if distributed.is_main_process():
                warm_start_eval = greedy_eval(generator, tokenizer, sampling, build_env(eval_spec))
                warm_start_eval_path.write_text(json.dumps(warm_start_eval, sort_keys=True))
                log.info("warm-start greedy average %.4f", warm_start_eval["average_accuracy"])
        elif distributed.is_main_process() and not warm_start_eval_path.exists():
            log.warning("--eval_warm_start: this run resumed from a checkpoint, and its warm-start was never evaluated")
        # while process 0 evaluates
        distributed.wait_for_every_process("launch.train: warm-start evaluation", processes.shutdown_timeout_s)
    history = loop.run()
    last_eval = None
    if selection is not None:
        if _EVAL_TASKS.value and selection.best.best_step != loop.iteration:
            # The last weights too, on the same questions: what the selection changed, in the summary's last_eval.
            if distributed.is_main_process():
                last_eval = greedy_eval(generator, tokenizer, sampling, build_env(eval_spec))
            distributed.wait_for_every_process("launch.train: last weights' evaluation", processes.shutdown_timeout_s)
        selected_iteration = selection.best.restore(learner)
        selection.best.close()
        weight_sync(learner.model, loop.policy_version)  # the generator evaluates the selected weights
        log.info("selected the weights of iteration %d of %d (%s %.4f on %s)", selected_iteration, loop.iteration,
                 _SELECTION_SCORE.value, selection.best.scores[selected_iteration], ",".join(_SELECTION_TASKS.value))
    final_model = distributed.host_copy(learner.model)
    checkpointer.close()
    if not distributed.is_main_process():
        generator.close()
        # while process 0 evaluates and writes
        distributed.wait_for_every_process("launch.train: end of run", processes.shutdown_timeout_s)
        return
    final_dir = hf_io.save(final_model, log_dir / "conductor_final")  # merged weights, with LoRA
    tokenizer.save_pretrained(final_dir)
    save_trained_sampling(final_dir, sampling, env_spec.config.conductor_prompt)
    summary = {"iterations": loop.iteration, "logdir": str(log_dir), "conductor_final": str(final_dir)}
    if lora.enabled:
        adapter_dir = save_peft_adapter(final_model, final_dir / "lora_adapter", base_model=str(lora_base_dir))
        summary["lora_adapter"] = str(adapter_dir)
    if history:
        # The whole run's iterations, not this process's: a resumed run's own are only its last ones.
        first, last = first_and_last_fifth([record["reward/mean"] for record in read_metrics(log_dir)])
        summary["reward_first_fifth"], summary["reward_last_fifth"] = first, last
        # This process's own: a resumed run compiles its programs afresh in its first iterations.
        summary["xla_compiles_after_iteration_3"] = int(sum(scalars["compile/programs"] for scalars in history[3:]))
    if env.world.oracle is not None:
        summary["oracle_expected_reward"] = env.world.oracle.expected_reward
    if _FORMAT_CHECK_QUESTIONS.value:
        questions = held_out_questions(env.world.tasks, _FORMAT_CHECK_QUESTIONS.value, loop_config.seed)
        validity = greedy_valid_format(
            generator, tokenizer, questions, pool_size=len(env.world.pool), max_steps=env.config.max_steps,
            access_mode=env.config.access_mode, max_new_tokens=sampling.max_new_tokens,
            conductor_prompt=env.config.conductor_prompt,
        )
        log.info("greedy valid format %d/%d%s", validity.valid, validity.questions,
                 "".join(f"\n  {question!r}: {error}" for question, error in validity.failures[:3]))
        summary["greedy_valid_format"] = validity.rate
    if selection is not None:
        summary["selection"] = {
            "tasks": _SELECTION_TASKS.value, "score": _SELECTION_SCORE.value, "selected_iteration": selected_iteration,
            "selected_score": selection.best.scores[selected_iteration],
            "scores": {str(iteration): score for iteration, score in sorted(selection.best.scores.items())},
        }
    if _EVAL_TASKS.value:
        summary["eval"] = greedy_eval(generator, tokenizer, sampling, build_env(eval_spec))
        if selection is not None:
            summary["last_eval"] = last_eval or summary["eval"]
    if _EVAL_WARM_START.value and warm_start_eval_path.exists():
        summary["warm_start_eval"] = json.loads(warm_start_eval_path.read_text())
    writer.close()
    generator.close()
    print(json.dumps(summary, sort_keys=True))
    distributed.wait_for_every_process("launch.train: end of run", processes.shutdown_timeout_s)


if __name__ == "__main__":
    app.run(main)
