"""`launch.sft` and its teachers (`conductor.teachers`): the command's output, the teachers' examples and their
decision-probe labels (the probe reads the state that chooses the first worker id)."""

from __future__ import annotations

import collections
import dataclasses
import json
import random
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

from conductor import teachers
from conductor.loop_environment import TokenizedConductorEnv
from conductor.teachers import TeacherConfig
from env import pools
from env.executor import ExecutorConfig
from env.gym_env import ConductorEnv, EnvConfig
from env.optimum import access_pattern
from env.orchestration import OrchestrationWorldConfig
from env.prompts import CONDUCTOR_PREFIX
from env.tasks.synthetic import TASK_LABELS
from env.workers.replay import ROUTERDC_MODELS
from env.workflow import parse_workflow
from env.worlds import ReplayWorldConfig, SyntheticWorldConfig, build_world
from models import ModelConfig, Transformer, zoo
from models.tokenizer import load_tokenizer
from rl.loop import question_order
from rl.supervised import SFTConfig, SupervisedTrainer
from tests.env.test_orchestration import RECIPE_REWARD
from tests.tiny_models import tiny_config


pytestmark = pytest.mark.usefixtures("parsed_flags")  # tests/launch/conftest.py


def _tiny_model():
    return Transformer(ModelConfig.from_hf(tiny_config("llama")), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def world():
    tokenizer = load_tokenizer(zoo.smollm2_135m_instruct())
    env = ConductorEnv(build_world(SyntheticWorldConfig(num_workers=4, num_tasks=12)))
    return TokenizedConductorEnv(env, tokenizer)


def test_template_examples_label_every_example_with_its_questions_task(world):
    examples = teachers.template_examples(world, 24, random.Random(0), probe=True)
    labels = teachers.task_label_indices(world)
    assert labels == {task_label: index for index, task_label in enumerate(sorted(TASK_LABELS))}
    questions = {tuple(world.prompt_ids(q)): q for q in range(world.num_questions)}
    for example in examples:
        task = world.tasks[questions[example.prompt_ids]]
        assert example.probe_label == labels[task.task_label]
        chosen = world.tokenizer.decode(list(example.completion_ids[example.probe_index : example.probe_index + 1]))
        assert chosen.strip().isdigit()
    assert all(e.probe_index is None for e in teachers.template_examples(world, 4, random.Random(0)))


def test_rollout_examples_label_the_logged_workflows_that_name_a_worker(world, tmp_path):
    workflow_ids = world.tokenizer.encode('\nmodel_id = [2]\nsubtasks = ["Solve."]\naccess_list = [[]]')
    broken_ids = world.tokenizer.encode("\nsubtasks = []")
    path = tmp_path / "rollouts.jsonl"
    records = [
        {"question": 5, "round": 0, "reward": 1.0, "completion_ids": workflow_ids},
        {"question": 6, "round": 0, "reward": 1.0, "completion_ids": broken_ids},
        {"question": 7, "round": 0, "reward": 0.0, "completion_ids": workflow_ids},
    ]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    labelled, unlabelled = teachers.rollout_examples(world, str(path), min_reward=1.0, probe=True)
    assert labelled.probe_label == teachers.task_label_indices(world)[world.tasks[5].task_label]
    assert world.tokenizer.decode(list(workflow_ids[labelled.probe_index : labelled.probe_index + 1])).strip() == "2"
    assert (unlabelled.probe_index, unlabelled.probe_label) == (None, None)


def _replay_world(expected_grades: bool) -> TokenizedConductorEnv:
    world = build_world(ReplayWorldConfig(files=("gsm8k-test", "arc_challenge_test"), limit_per_file=10))
    env = ConductorEnv(world, EnvConfig(max_steps=1, expected_grades=expected_grades, executor=ExecutorConfig(seed=0)))
    return TokenizedConductorEnv(env, load_tokenizer(zoo.smollm2_135m_instruct()))


def _route(world: TokenizedConductorEnv, example) -> tuple[int, int]:
    """(question, final worker) of a world-teacher example."""
    question = next(q for q in range(world.num_questions) if tuple(world.prompt_ids(q)) == example.prompt_ids)
    text = world.tokenizer.decode(list(example.completion_ids), skip_special_tokens=True)
    workflow = parse_workflow(CONDUCTOR_PREFIX + text, len(ROUTERDC_MODELS), 1, "binary")
    return question, workflow.steps[-1].worker


def test_task_reasoning_opens_each_template_with_its_questions_task_and_changes_nothing_else(world):
    task_label = TeacherConfig(templates=("single", "plan_solve_verify"), reasoning="task")
    plain = TeacherConfig(templates=("single", "plan_solve_verify"))
    named = teachers.template_examples(world, 16, random.Random(4), task_label, probe=True)
    unnamed = teachers.template_examples(world, 16, random.Random(4), plain, probe=True)
    questions = {tuple(world.prompt_ids(q)): q for q in range(world.num_questions)}
    assert {world.tasks[questions[e.prompt_ids]].task_label for e in named} == set(TASK_LABELS)
    for with_task, without in zip(named, unnamed, strict=True):
        task_label = world.tasks[questions[with_task.prompt_ids]].task_label
        text = world.tokenizer.decode(list(with_task.completion_ids), skip_special_tokens=True)
        plain_text = world.tokenizer.decode(list(without.completion_ids), skip_special_tokens=True)
        assert text == f"\nThis is a {task_label} question. " + plain_text[1:]
        assert parse_workflow(text, 4).steps == parse_workflow(plain_text, 4).steps
        assert with_task.probe_label == without.probe_label
        assert world.tokenizer.decode(list(with_task.completion_ids[with_task.probe_index:][:1])).strip().isdigit()
    with pytest.raises(ValueError, match="unknown reasoning 'label'"):
        TeacherConfig(reasoning="label")


def _drawn_questions(world: TokenizedConductorEnv, count: int, seed: int) -> list[int]:
    """The questions `world_examples` draws with `random.Random(seed)`, unstratified."""
    return question_order(world.num_questions, random.Random(seed).randrange(2**31), 0, count)


def test_world_examples_weight_every_route_of_a_question_by_its_expected_grade():
    world = _replay_world(expected_grades=True)
    single = TeacherConfig(teacher="world", templates=("single",))
    examples = teachers.world_examples(world, 3 * len(ROUTERDC_MODELS), random.Random(0), single, probe=True)
    drawn = _drawn_questions(world, 3, seed=0)
    # Each question's routes are consecutive, worker 0 to 6, weight 0 included (the trainer batches them whole).
    assert [_route(world, e) for e in examples] == [(q, w) for q in drawn for w in range(len(ROUTERDC_MODELS))]
    for example in examples:
        question, worker = _route(world, example)
        assert example.weight == pytest.approx(world.tasks[question].metadata["scores"][ROUTERDC_MODELS[worker]],
                                               abs=1e-7)  # fmt: skip
        assert example.probe_label == teachers.task_label_indices(world)[world.tasks[question].task_label]
    assert 0.0 in {e.weight for e in examples}  # a route that is never right stays, with weight 0
    batch = SupervisedTrainer(_tiny_model(), SFTConfig()).batch(examples[: 2 * len(ROUTERDC_MODELS)], pad_id=0)
    assert batch.prompt_block_size(batch.batch_size) == len(ROUTERDC_MODELS)


def test_world_examples_with_drawn_grades_weight_the_right_answers_only():
    world = _replay_world(expected_grades=False)
    single = TeacherConfig(teacher="world", templates=("single",))
    examples = teachers.world_examples(world, 20 * len(ROUTERDC_MODELS), random.Random(1), single)
    assert {e.weight for e in examples} == {0.0, 1.0}
    # 140 drawn routes: the right share is the mean recorded score of the routes tried (standard error <= 0.043)
    tried = [
        world.tasks[question].metadata["scores"][model]
        for question in _drawn_questions(world, 20, seed=1)
        for model in ROUTERDC_MODELS
    ]
    assert len(examples) == len(tried)
    right = sum(e.weight for e in examples)
    assert right / len(examples) == pytest.approx(sum(tried) / len(tried), abs=0.15)


def test_all_routes_templates_write_each_drawn_question_once_per_worker_in_a_row_without_reading_grades():
    world = _replay_world(expected_grades=True)
    pool = len(ROUTERDC_MODELS)
    all_routes = TeacherConfig(templates=("single",), all_routes=True)
    examples = teachers.template_examples(world, 3 * pool - 2, random.Random(5), all_routes, probe=True)
    routes = [_route(world, e) for e in examples]
    questions = [question for question, _ in routes[::pool]]
    assert routes == [(q, w) for q in questions for w in range(pool)]  # 3 questions, every worker, consecutive
    assert {e.weight for e in examples} == {1.0}  # uniform: no grade is read
    for example in examples:
        assert example.probe_label == teachers.task_label_indices(world)[world.tasks[_route(world, example)[0]].task_label]
    batch = SupervisedTrainer(_tiny_model(), SFTConfig()).batch(examples[:pool], pad_id=0)
    assert batch.prompt_block_size(batch.batch_size) == pool


def test_all_routes_change_only_the_final_worker_of_a_multi_step_template(world):
    config = TeacherConfig(templates=("plan_solve_verify",), all_routes=True)
    examples = teachers.template_examples(world, 8, random.Random(6), config)
    pool = len(world.env.world.pool)
    assert len(examples) == 2 * pool
    for start in (0, pool):
        texts = [world.tokenizer.decode(list(e.completion_ids), skip_special_tokens=True)
                 for e in examples[start : start + pool]]  # fmt: skip
        workflows = [parse_workflow(CONDUCTOR_PREFIX + text, pool, 5, "binary") for text in texts]
        assert [w.steps[-1].worker for w in workflows] == list(range(pool))
        assert len({w.steps[:-1] for w in workflows}) == 1 and len(workflows[0].steps) == 3
        assert len({w.steps[-1].instruction for w in workflows}) == 1


def test_all_routes_is_refused_outside_the_first_round_templates_teacher():
    with pytest.raises(ValueError, match="for the templates teacher"):
        TeacherConfig(teacher="world", all_routes=True)
    with pytest.raises(ValueError, match="for the templates teacher"):
        TeacherConfig(teacher="rollouts", rollouts="runs/x/rollouts.jsonl", all_routes=True)
    tokenizer = load_tokenizer(zoo.smollm2_135m_instruct())
    recursive = TokenizedConductorEnv(
        ConductorEnv(build_world(SyntheticWorldConfig(num_workers=3, num_tasks=4)), EnvConfig(recursion_rounds=1)),
        tokenizer,
    )
    with pytest.raises(ValueError, match="does not combine with recursion"):
        teachers.template_examples(recursive, 6, random.Random(0), TeacherConfig(all_routes=True))


def test_route_weights_by_grade_or_by_the_positive_part_of_the_grade_over_the_question_mean():
    assert teachers.route_weights([1.0, 0.0, 1.0, 1.0], "grade") == [1.0, 0.0, 1.0, 1.0]
    assert teachers.route_weights([1.0, 0.0, 1.0, 1.0], "advantage") == pytest.approx([0.25, 0.0, 0.25, 0.25])
    assert teachers.route_weights([0.2, 0.8, 0.5], "advantage") == pytest.approx([0.0, 0.3, 0.0])
    assert teachers.route_weights([1.0, 1.0, 1.0], "advantage") == [0.0, 0.0, 0.0]  # nothing to learn about routing
    with pytest.raises(ValueError, match="unknown route weighting"):
        teachers.route_weights([1.0], "rank")


def test_advantage_weighted_world_examples_weight_each_route_by_its_lead_over_the_question_mean():
    world = _replay_world(expected_grades=True)
    advantage = TeacherConfig(teacher="world", templates=("single",), world_weights="advantage")
    examples = teachers.world_examples(world, 6 * len(ROUTERDC_MODELS), random.Random(3), advantage)
    for example in examples:
        question, worker = _route(world, example)
        scores = world.tasks[question].metadata["scores"]
        lead = scores[ROUTERDC_MODELS[worker]] - np.mean([scores[model] for model in ROUTERDC_MODELS])
        assert example.weight == pytest.approx(max(lead, 0.0), abs=1e-6)
    assert any(e.weight > 0 for e in examples) and any(e.weight == 0 for e in examples)


def test_stratified_world_examples_draw_the_task_labels_equally():
    world = _replay_world(expected_grades=True)  # 10 GSM8K and 10 ARC-Challenge questions
    stratified = TeacherConfig(teacher="world", templates=("single",), stratify_questions=True)
    examples = teachers.world_examples(world, 8 * len(ROUTERDC_MODELS), random.Random(2), stratified)
    drawn = question_order(world.num_questions, random.Random(2).randrange(2**31), 0, 8, world.question_labels)
    assert collections.Counter(world.tasks[q].task_label for q in drawn) == {"gsm8k": 4, "arc_challenge": 4}
    assert {_route(world, e)[0] for e in examples} <= set(drawn)
    unstratified = question_order(world.num_questions, random.Random(2).randrange(2**31), 0, 8)
    assert unstratified != drawn


@pytest.mark.slow
def test_the_sft_command_measures_validity_at_the_rl_temperature_and_writes_an_hf_dir(tmp_path):
    out = tmp_path / "sft"
    command = [
        sys.executable, "-m", "launch.sft", "--world=synthetic", "--synthetic_tasks=8", "--conductor=tiny",
        "--tiny_layers=1", "--tiny_width=32", "--warm_start_steps=3", "--warm_start_batch_size=2",
        "--warm_start_validity_samples=4",
        "--max_tokens=8", "--temperature=0.5", "--warm_start_learning_rate_schedule=cosine", f"--logdir={out}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["temperature"] == 0.5 and summary["steps"] == 3 and summary["out"] == str(out)
    # Eight new tokens cannot hold the three lists, so no sample is a workflow before or after.
    assert summary["valid_before"] == 0.0 and summary["valid_after"] == 0.0
    assert summary["final_nll"] > 0
    assert "valid workflows before warm-start: 0.0% (temperature 0.5)" in result.stderr
    assert (out / "config.json").exists() and list(out.glob("*.safetensors"))
    # eval and serve sample it at the settings its format was checked at
    assert json.loads((out / "trained_sampling.json").read_text()) == {
        "max_new_tokens": 8, "temperature": 0.5, "conductor_prompt": "full"
    }


def test_template_examples_on_offered_pools_name_each_questions_own_ids_and_whole_pool_teachers_refuse():
    from env.worlds import World

    base = build_world(SyntheticWorldConfig(num_workers=6, num_tasks=12))
    offered = [pools.offer(task, tuple(range(index % 3, 6, 1 + index % 3))) for index, task in enumerate(base.tasks)]
    world = World("offered", base.pool, offered)
    environment = TokenizedConductorEnv(ConductorEnv(world), load_tokenizer(zoo.smollm2_135m_instruct()))
    questions = {tuple(environment.prompt_ids(q)): q for q in range(environment.num_questions)}
    seen = set()
    for example in teachers.template_examples(environment, 60, random.Random(0)):
        question = questions[example.prompt_ids]
        text = CONDUCTOR_PREFIX + environment.tokenizer.decode(list(example.completion_ids), skip_special_tokens=True)
        pool = pools.offered_pool(world.tasks[question])
        workers = {step.worker for step in parse_workflow(text, pool, 5).steps}  # raises on an id not offered
        seen |= {(pool, worker) for worker in workers}
    # pools (0..5), (1, 3, 5) and (2, 5): each question's workflows name its own ids, and every one of them
    assert {(pool, worker) for pool in {p for p, _ in seen} for worker in pool} == seen
    assert {p for p, _ in seen} == {(0, 1, 2, 3, 4, 5), (1, 3, 5), (2, 5)}
    with pytest.raises(ValueError, match="some questions offer fewer"):
        teachers.template_examples(environment, 4, random.Random(0), TeacherConfig(all_routes=True))


def _orchestration_env(reward, prompt: str = "full") -> TokenizedConductorEnv:
    world = build_world(OrchestrationWorldConfig(split="validation"), reward, max_steps=3)
    env = ConductorEnv(world, EnvConfig(max_steps=3, reward=reward, conductor_prompt=prompt))
    return TokenizedConductorEnv(env, load_tokenizer(zoo.smollm2_135m_instruct()))


def _written_workflows(environment: TokenizedConductorEnv, examples) -> list:
    """Each question's example, parsed against the ids its question offers (an id it does not offer raises)."""
    return [
        parse_workflow(
            CONDUCTOR_PREFIX + environment.tokenizer.decode(list(example.completion_ids), skip_special_tokens=True),
            pools.offered_pool(environment.tasks[question]), 3,
        )
        for question, example in enumerate(examples)
    ]


def test_optimum_examples_write_each_questions_best_workflow_under_the_runs_reward():
    environment = _orchestration_env(RECIPE_REWARD, "compact")
    reference = environment.env.world.orchestration
    examples = teachers.optimum_examples(environment)
    assert len(examples) == environment.num_questions
    workflows = _written_workflows(environment, examples)
    for question, (example, workflow) in enumerate(zip(examples, workflows)):
        task = environment.tasks[question]
        assert example.prompt_ids == tuple(environment.prompt_ids(question))  # the run's prompt, compact here
        # Its exact expected reward, computed for this workflow alone, is the best of every candidate's in its context.
        best = reference.table(pools.offered_pool(task))[1][reference.row(task)].max()
        assert reference.expected_reward(task, workflow) == pytest.approx(best, abs=1e-12)
    assert len({access_pattern(workflow) for workflow in workflows}) >= 3
    # A heavier step penalty makes a shorter optimum: the targets follow the run's reward.
    costly = _orchestration_env(dataclasses.replace(RECIPE_REWARD, step_penalty=0.3))
    costly_workflows = _written_workflows(costly, teachers.optimum_examples(costly))
    assert np.mean([len(w.steps) for w in costly_workflows]) < np.mean([len(w.steps) for w in workflows])


def test_the_optimum_teacher_needs_a_world_that_knows_its_optimum(world):
    with pytest.raises(ValueError, match="needs a world that knows each question's optimum.*synthetic world does not"):
        teachers.teacher_examples(TeacherConfig(teacher="optimum"), world, 4, random.Random(0))
