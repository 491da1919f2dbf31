"""The warm-start's teachers: where its supervised targets come from.

`templates`: template workflows (single worker, plan -> solve -> verify, fan-out + aggregate) with workers drawn
uniformly, so the student writes valid workflows and routes at random; with `all_routes`, each drawn question's
template is written once per pool worker instead, so its routing target is exactly uniform. `rollouts`:
rejection-sampling fine-tuning on the high-reward completions a training run logged to its rollouts.jsonl. `world`:
rejection-sampling fine-tuning against the world itself, template workflows executed and graded now, each weighted
by its grade (`world_examples`). `optimum`: each training question's best workflow under the run's reward, where the
world knows it exactly (`optimum_examples`).
With a task probe, each example is labelled with its question's task at the first worker id it writes.
"""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Literal, Mapping, Sequence, get_args

from conductor.loop_environment import TokenizedConductorEnv, completion_ids, worker_id_tokens
from env.pools import named, offered_ids
from env.policies import DEFAULT_TEMPLATES, TEMPLATES, random_template
from env.workflow import Workflow
from rl.loop import question_order
from rl.supervised import Example

Teacher = Literal["templates", "rollouts", "world", "optimum"]
RouteWeighting = Literal["grade", "advantage"]
Reasoning = Literal["template", "task"]


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
    """`teacher` picks the teacher; `templates` are the template policies the templates and world teachers draw
    from (`env.policies.TEMPLATES`); the rollouts teacher keeps the first-round completions of the run log
    `rollouts` with a reward of at least `min_reward`; the world teacher weights each route by `world_weights`
    (`route_weights`) and, with `stratify_questions`, draws the task labels in turn. `reasoning="task"` opens each
    template's reasoning line with the question's task label (`with_reasoning`). `all_routes` makes the templates
    teacher write each drawn question's template once per pool worker (`template_examples`)."""

    teacher: Teacher = "templates"
    templates: tuple[str, ...] = DEFAULT_TEMPLATES
    rollouts: str | None = None
    min_reward: float = 1.0
    world_weights: RouteWeighting = "grade"
    stratify_questions: bool = False
    reasoning: Reasoning = "template"
    all_routes: bool = False

    @property
    def reads_reward(self) -> bool:
        """Whether the targets depend on the run's reward: only the optimum teacher's do (the world teacher weights
        routes by their grades; the rollouts teacher filters its log by `min_reward`, a teacher setting)."""
        return self.teacher == "optimum"

    def __post_init__(self) -> None:
        if self.teacher not in get_args(Teacher):
            raise ValueError(f"unknown teacher {self.teacher!r}; choose from {get_args(Teacher)}")
        unknown = sorted(set(self.templates) - set(TEMPLATES))
        if unknown or not self.templates:
            raise ValueError(f"unknown templates {unknown}; choose from {sorted(TEMPLATES)}")
        if self.world_weights not in get_args(RouteWeighting):
            raise ValueError(
                f"unknown route weighting {self.world_weights!r}; expected one of {get_args(RouteWeighting)}"
            )
        if self.reasoning not in get_args(Reasoning):
            raise ValueError(f"unknown reasoning {self.reasoning!r}; expected one of {get_args(Reasoning)}")
        if self.teacher == "rollouts" and not self.rollouts:
            raise ValueError("--warm_start_teacher=rollouts needs --warm_start_rollouts")
        if self.all_routes and self.teacher != "templates":
            raise ValueError(
                f"--warm_start_all_routes is for the templates teacher; the {self.teacher} teacher's routes come from "
                + ("the world, which writes every route already" if self.teacher == "world" else "the run log")
            )


def teacher_examples(
    config: TeacherConfig, environment: TokenizedConductorEnv, count: int, rng: random.Random, probe: bool = False
) -> list[Example]:
    """About `count` examples from the configured teacher (all of a run log's for the rollouts teacher)."""
    if config.teacher == "templates":
        return template_examples(environment, count, rng, config, probe)
    if config.teacher == "world":
        return world_examples(environment, count, rng, config, probe)
    if config.teacher == "optimum":
        return optimum_examples(environment, probe)
    return rollout_examples(environment, config.rollouts, config.min_reward, probe)


def with_reasoning(
    workflow: Workflow, environment: TokenizedConductorEnv, question: int, config: TeacherConfig
) -> Workflow:
    """The template as the student writes it: with `reasoning="task"` its reasoning line first names the question's
    task label (a label of the question, not a grade), so the worker id follows a token that differs by task
    where the template's fixed line gives every task the same one. Whether that keeps RL's routing update for one
    task from moving the others' is measured in docs/log/2026-11-27-replay-rl-from-bandit-feedback.md (on the replay
    world it does not)."""
    if config.reasoning == "template":
        return workflow
    task_label = environment.tasks[question].task_label
    return dataclasses.replace(workflow, reasoning=f"This is a {task_label} question. {workflow.reasoning}")


def task_label_indices(environment: TokenizedConductorEnv) -> dict[str, int]:
    """Each task label of the world, numbered in sorted order (the probe's classes)."""
    return {task_label: index for index, task_label in enumerate(sorted({task.task_label for task in environment.tasks}))}


def make_example(
    environment: TokenizedConductorEnv, question: int, ids: Sequence[int], labels: Mapping[str, int] | None
) -> Example:
    """A (prompt, completion) example; with `labels`, labelled with the question's task at the first worker id."""
    prompt = tuple(environment.prompt_ids(question))
    route_tokens = worker_id_tokens(environment.tokenizer, ids) if labels is not None else ()
    if not route_tokens:
        return Example(prompt, tuple(ids))
    return Example(prompt, tuple(ids), route_tokens[0], labels[environment.tasks[question].task_label])


def template_examples(
    environment: TokenizedConductorEnv, count: int, rng: random.Random, config: TeacherConfig = TeacherConfig(),
    probe: bool = False,
) -> list[Example]:
    """`count` (prompt, uniformly routed template workflow) pairs over the world's questions.

    With `config.all_routes`, about `count` pairs from `count / pool size` questions, each question's template written
    once with every pool worker as its final step, in consecutive examples (a batch of a multiple of the pool size
    holds whole questions). Drawn workers fit, besides the format, whatever chance ties their draws to the questions'
    features, so the warm-started routing leans towards some workers task by task before RL has seen a grade;
    every route of a question in equal weight has one optimum, uniform routing on every question.

    With recursion rounds (`--recursion_rounds` N), each example's round is drawn uniformly from the N + 1, so the
    student learns the format of every prompt an episode shows it: a later round's prompt follows a template
    workflow run in the world, and its target is a new template workflow or, half the time, the three empty lists
    that keep the answer (which to write is left to RL)."""
    pool_size = len(environment.env.world.pool)
    rounds = environment.env.config.recursion_rounds
    labels = task_label_indices(environment) if probe else None
    if config.all_routes:
        _check_whole_pools(environment, "--warm_start_all_routes")
        if rounds:
            raise ValueError(
                "--warm_start_all_routes writes first-round workflows only; it does not combine with recursion"
            )
        examples = []
        for _ in range(-(-count // pool_size)):
            question = rng.randrange(environment.num_questions)
            workflow = with_reasoning(random_template(pool_size, rng, config.templates), environment, question, config)
            for route in every_final_worker(workflow, pool_size):
                ids = completion_ids(environment, route)
                examples.append(make_example(environment, question, ids, labels))
        return examples
    examples, earlier_rounds, targets = [], [], []
    for _ in range(count):
        question = rng.randrange(environment.num_questions)
        # A question offering a pool of its own (`env.pools`) names its workers alone.
        offered = offered_ids(environment.tasks[question], pool_size)
        workflow = with_reasoning(_offered_template(offered, rng, config), environment, question, config)
        ids = completion_ids(environment, workflow)
        if rounds and rng.randrange(rounds + 1):
            kept = rng.random() < 0.5
            target = Workflow(steps=()) if kept else with_reasoning(
                _offered_template(offered, rng, config), environment, question, config
            )
            earlier_rounds.append((question, ids))
            targets.append(completion_ids(environment, target))
        else:
            examples.append(make_example(environment, question, ids, labels))
    if earlier_rounds:
        questions, ids = zip(*earlier_rounds)
        scored = environment.score(questions, ids, None, range(len(questions)))
        examples += [Example(tuple(rollout.followup_prompt_ids), target) for rollout, target in zip(scored, targets)]
    return examples


def rollout_examples(
    environment: TokenizedConductorEnv, path: str, min_reward: float, probe: bool = False
) -> list[Example]:
    """Logged completions (the generator's own token ids) that earned at least `min_reward`."""
    labels = task_label_indices(environment) if probe else None
    examples = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            if record["reward"] >= min_reward and record["round"] == 0:
                examples.append(make_example(environment, record["question"], record["completion_ids"], labels))
    if not examples:
        raise ValueError(f"{path} has no first-round rollout with reward >= {min_reward}")
    return examples


def optimum_examples(environment: TokenizedConductorEnv, probe: bool = False) -> list[Example]:
    """One example per question: the workflow with the highest exact expected reward for the question's task,
    difficulty and offered pool under the run's reward and step limit (`OrchestrationReference.per_question`).

    Supervised learning on the hindsight-best action of each training question, as a router is trained on which model
    answered each training question right: the world's exact outcomes play the part of a replay world's recorded ones.
    Only the orchestration world knows its optimum exactly; the others refuse."""
    reference = environment.env.world.orchestration
    if reference is None:
        raise ValueError(
            f"--warm_start_teacher=optimum needs a world that knows each question's optimum (--world=orchestration); "
            f"the {environment.env.world.name} world does not"
        )
    labels = task_label_indices(environment) if probe else None
    return [
        make_example(environment, question, completion_ids(environment, reference.per_question(task).workflow), labels)
        for question, task in enumerate(environment.tasks)
    ]


def world_examples(
    environment: TokenizedConductorEnv, count: int, rng: random.Random, config: TeacherConfig = TeacherConfig(),
    probe: bool = False,
) -> list[Example]:
    """About `count` template workflows, executed and graded in the world, each weighted by its grade
    (`config.world_weights`, `route_weights`).

    Questions come from `rl.loop.question_order` (the task labels in turn with `config.stratify_questions`, so a small
    task file is not drowned by a large one); each gets one random template, run once with every pool worker as its
    final (answering) step, so every route's grade on the question is seen (a full-information sample of the routing
    decision). A weighted example counts as that many copies (rl.supervised), so with grade weights and 0/1 grades this
    keeps the right workflows (rejection sampling) and with `--expected_grades` it is reward-weighted regression:
    either way the student learns to route each question in proportion to each worker's chance of answering it, and
    greedy decoding picks the likeliest. A question's routes are consecutive examples, weight 0 included, so the
    trainer keeps them in one batch and encodes their prompt once (a batch of a multiple of the pool size holds
    whole questions).
    """
    pool_size = len(environment.env.world.pool)
    _check_whole_pools(environment, "the world teacher")
    labels = task_label_indices(environment) if probe else None
    question_labels = environment.question_labels if config.stratify_questions else None
    questions, completions = [], []
    for question in question_order(environment.num_questions, rng.randrange(2**31), 0, -(-count // pool_size), question_labels):
        workflow = with_reasoning(random_template(pool_size, rng, config.templates), environment, question, config)
        for route in every_final_worker(workflow, pool_size):
            questions.append(question)
            completions.append(completion_ids(environment, route))
    rollouts = environment.score(questions, completions, [None] * len(questions), range(len(questions)))
    grades = [rollout.metrics["correct"] for rollout in rollouts]
    weights = [
        weight
        for start in range(0, len(grades), pool_size)
        for weight in route_weights(grades[start : start + pool_size], config.world_weights)
    ]
    if not any(weight > 0 for weight in weights):
        raise ValueError(f"no template workflow earned a {config.world_weights} weight above 0 in this world")
    return [
        dataclasses.replace(make_example(environment, question, ids, labels), weight=weight)
        for question, ids, weight in zip(questions, completions, weights)
    ]


def _offered_template(offered: tuple[int, ...], rng: random.Random, config: TeacherConfig) -> Workflow:
    """A random template over the model ids `offered`."""
    return named(random_template(len(offered), rng, config.templates), offered)


def _check_whole_pools(environment: TokenizedConductorEnv, teacher: str) -> None:
    """Refuses questions offering fewer workers than the pool: `teacher` writes a route to every worker."""
    pool_size = len(environment.env.world.pool)
    if any(len(offered_ids(task, pool_size)) != pool_size for task in environment.tasks):
        raise ValueError(f"{teacher} routes to every worker of the pool; some questions offer fewer (env.pools)")


def every_final_worker(workflow: Workflow, pool_size: int) -> list[Workflow]:
    """`workflow` once per pool worker as its final (answering) step, workers 0 to pool_size - 1 in order."""
    *earlier, final = workflow.steps
    return [
        dataclasses.replace(workflow, steps=(*earlier, dataclasses.replace(final, worker=worker)))
        for worker in range(pool_size)
    ]


def route_weights(grades: Sequence[float], mode: str) -> list[float]:
    """The world teacher's weights of one question's routes, from their grades.

    "grade" makes the weighted likelihood reward-weighted regression: the student routes a task's questions in
    proportion to each worker's mean grade, so when the workers of a task are close the best leads by little.
    "advantage" subtracts the question's mean grade and drops what is left under 0, the positive part of a
    baseline-subtracted reward: a question every worker answers alike then teaches nothing about routing, and the
    best worker's lead grows.
    """
    if mode == "grade":
        return list(grades)
    if mode == "advantage":
        mean = sum(grades) / len(grades)
        return [max(grade - mean, 0.0) for grade in grades]
    raise ValueError(f"unknown route weighting {mode!r}; expected one of {get_args(RouteWeighting)}")
