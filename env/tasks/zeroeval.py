"""Questions of the zeroeval world: ZeroEval's recorded greedy outputs of 16 API and open models on GSM8K, MATH level 5
and CRUXEval-O (GitHub WildEval/ZeroEval at ZEROEVAL_COMMIT, `result_dirs/<task>/<model>.json`; docs/zeroeval.md).

Every record holds the prompt a model was sent (`chat_history`), its full text (`output`, a JSON block with
`reasoning` and `answer`, as the prompt asked) and the reference answer. A task's `metadata["records"]` maps each model
that answered the question to its `Record`; `env.workers.recorded.RecordedWorker` replays it.

The answer of a recorded output is read the way ZeroEval reads it (`zeroeval_answer`): the first complete JSON object's
`answer`, else a regular expression over `"answer": ...`, else (Llama-3.1 models only) a `\\boxed{...}` near the end.
GSM8K and MATH answers are then graded by `env.tasks.graders.grade_math` (normalisation, then math-verify);
CRUXEval answers by `grade_crux`, ZeroEval's own rule (the strings equal once quotes are stripped). ZeroEval grades
GSM8K and MATH by the first number in each answer instead, which `zeroeval_grade` reproduces to check the records
against its published summaries (`published_accuracy`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
from pathlib import Path
from typing import Mapping, Sequence

from env.tasks.answers import ANSWER_INSTRUCTION, extract_answer
from env.tasks.base import Task
from env.tasks.data_files import RemoteDataset, RemoteFile, locate
from env.tasks.graders import grade_math

ZEROEVAL_COMMIT = "8c1485edf12c6efb5f69135a562927c5ad484059"
ZEROEVAL_TASKS = ("gsm", "math-l5", "crux")
ZEROEVAL_MODELS = (
    "o1-mini-2024-09-12",
    "gpt-4o-2024-08-06",
    "gpt-4o-mini-2024-07-18",
    "gpt-3.5-turbo-0125",
    "claude-3-5-sonnet-20241022",
    "claude-3-5-haiku-20241022",
    "claude-3-haiku-20240307",
    "gemini-1.5-pro",
    "gemini-1.5-flash",
    "Meta-Llama-3.1-405B-Instruct@hyperbolic",
    "Meta-Llama-3.1-70B-Instruct",
    "Meta-Llama-3.1-8B-Instruct",
    "Qwen2-72B-Instruct",
    "gemma-2-9b-it",
    "deepseek-v2.5-0908",
    "Mistral-Large-2",
)
# The models whose weights are published (the rest are served only through their makers' APIs).
ZEROEVAL_OPEN_MODELS = ZEROEVAL_MODELS[9:]
# The model whose files hold every question of every task: it fixes the question order.
_REFERENCE_MODEL = "o1-mini-2024-09-12"
# Where a summary row names a model otherwise than its file (ZeroEval's `model_name_replacement`).
_SUMMARY_NAMES = {"Meta-Llama-3.1-405B-Instruct@hyperbolic": "Llama-3.1-405B-Inst@hyperbolic"}

# (name, size, sha256) of the 48 record files and 3 summaries under result_dirs/ at ZEROEVAL_COMMIT, computed from the
# team's copy and checked against the blobs of a clone at that commit (docs/log/2026-12-05-zeroeval-world.md).
_MANIFEST = (
    ("crux.summary.json", 8111,
     "6940bbee51fc2027017f4a819862238d489f0ce6b882eeff8f3d0ef6aa096dba"),
    ("crux/Meta-Llama-3.1-405B-Instruct@hyperbolic.json", 2282652,
     "e216a892a5fac76579904c0149347958d508f78726022ef1defdb8bfdb4b82af"),
    ("crux/Meta-Llama-3.1-70B-Instruct.json", 2891142,
     "86555ee77388dea2667b9ffe07967605ff59005062c7e054196971116164e5c0"),
    ("crux/Meta-Llama-3.1-8B-Instruct.json", 2921606,
     "97ea83662e316652e4b3cdab721cf198a29af684d29f86b83a87a16bd6788139"),
    ("crux/Mistral-Large-2.json", 1952667,
     "72eb0263635697c0a82dc652ddd232793cadc267dcbabc88d7fe55dcacc5cdc6"),
    ("crux/Qwen2-72B-Instruct.json", 2686133,
     "3721fb628707630ecf0ad5f5e903a1482fc1e123af3b0509389a89e337fffeb0"),
    ("crux/claude-3-5-haiku-20241022.json", 2323611,
     "a872a6201898cff32f7282ee581c88fe3a5e25e749579348b895e4be3a13bb34"),
    ("crux/claude-3-5-sonnet-20241022.json", 1953211,
     "85bad60fcf43ef681dec753ce7a446256edbe7daba639bb97b313f8833a23744"),
    ("crux/claude-3-haiku-20240307.json", 2224857,
     "e929a1953c12c057224da4ac28c3f87e608cf57d22cb29f75598bbb7ee28821f"),
    ("crux/deepseek-v2.5-0908.json", 1983582,
     "89d756f4b78bc647173bf931656f6b5976d436dc9017d5df5106f07db218c0f4"),
    ("crux/gemini-1.5-flash.json", 1981079,
     "48ba3b61999869717bbe25ea5b8d54cb8df1291d981c236787919c315d2094ba"),
    ("crux/gemini-1.5-pro.json", 1872813,
     "87cd836015d46f5f5298f20042bea7599a6d585954c4c277f495a5b6380c5141"),
    ("crux/gemma-2-9b-it.json", 1978543,
     "8dc654c65add34609b3dbb2c6be9170bd7b2bc68163de0ba80f80c86834dccb3"),
    ("crux/gpt-3.5-turbo-0125.json", 1890488,
     "5e8e595c29e412073c1a40f26de1c12a44945c4c399ee557021ce828767ee674"),
    ("crux/gpt-4o-2024-08-06.json", 2184094,
     "d7cfee3540a76747818445778b281d79472a6cde681af328a6df0832fa3e322f"),
    ("crux/gpt-4o-mini-2024-07-18.json", 2318690,
     "41e3446c313185e7bdba7a7b993fb2d365019e9255e887cb916031edc1d0692b"),
    ("crux/o1-mini-2024-09-12.json", 1954818,
     "913c446da0f6cdd2766782fa5c13cfb401a59c18b09a07b2f965fb645b989725"),
    ("gsm.summary.json", 7530,
     "d5da25d061035a92cdc855619c9bd67928b344b2a2b1730d4604664dd5f69dff"),
    ("gsm/Meta-Llama-3.1-405B-Instruct@hyperbolic.json", 2735610,
     "e64f5464c52821a0dd4a601882024998365d9b5e47a51365f3841df4e487db74"),
    ("gsm/Meta-Llama-3.1-70B-Instruct.json", 3651876,
     "b8e002cd8490719995e401f3eaf9d8befc4ca959edb91fdf78f71e621b86096e"),
    ("gsm/Meta-Llama-3.1-8B-Instruct.json", 3880145,
     "a4a42a1babe0f3d5bcd5de02aa53aa1c94d399d550acd9bfc836f4d95aaa748b"),
    ("gsm/Mistral-Large-2.json", 2381412,
     "2408a17dd838ef40d1c2a18fe1ff28d4a44661cf13bf4e12e5354bb628782e88"),
    ("gsm/Qwen2-72B-Instruct.json", 3283556,
     "6771d7cb9f93aaac58f7baef974047fb989e5eca2e8a772e84a97f2f0c594c53"),
    ("gsm/claude-3-5-haiku-20241022.json", 2857123,
     "9a1d077d4b357af3d5a93177b073bc3ac0fb24c3606c654237f514f954e92e2b"),
    ("gsm/claude-3-5-sonnet-20241022.json", 2369630,
     "b0094648de911b53cfebb2d159a2ec8861201d8b0281575bf1e18dca57004450"),
    ("gsm/claude-3-haiku-20240307.json", 2800290,
     "2233eb8f2938232664a69f059b81413c11aaa0651c296131bca22611654c2958"),
    ("gsm/deepseek-v2.5-0908.json", 2501381,
     "77b82f54507109f1d97a879d8b09b88177405e7cd901b2a260995e53422b6df0"),
    ("gsm/gemini-1.5-flash.json", 2327638,
     "b7df6ed602856d77747828910014eb2f73f51edf928e287692226b3626aa348d"),
    ("gsm/gemini-1.5-pro.json", 2386631,
     "4b186a42e5703f06d17c2ffe6dcd0a5f70d49962377208ffb7b5e8db3c915ba4"),
    ("gsm/gemma-2-9b-it.json", 3251077,
     "e0516d4739f6d1edb640308ac0c3f9357cce0cd5f38918456ca183e3212e100f"),
    ("gsm/gpt-3.5-turbo-0125.json", 2334160,
     "93a6dc49ac273c23c873662b21f2b7af7de66ba98e7ce323e8e4705904d11ec5"),
    ("gsm/gpt-4o-2024-08-06.json", 2478555,
     "c6a10991a08439f0b096ead60f9850f4f373b9ae6acc859bd5014c02f6fcee57"),
    ("gsm/gpt-4o-mini-2024-07-18.json", 2518569,
     "b8c38e23fd496db103e072e80dacf3e1a0b491b407a59d816403719c4f496fbb"),
    ("gsm/o1-mini-2024-09-12.json", 2323098,
     "600391c6cee4b6773ee221e4e8b545cc8445e41598dedab595fd9e022e498195"),
    ("math-l5.summary.json", 6864,
     "88d590dbea57952418d09de9a37f46a89fbae95f8b0bd166ec3f5cb464dd3eac"),
    ("math-l5/Meta-Llama-3.1-405B-Instruct@hyperbolic.json", 2340911,
     "281965fd9526ab6f3a8923402427584d38a539815c8189a4ee6b5c79299234b3"),
    ("math-l5/Meta-Llama-3.1-70B-Instruct.json", 3251669,
     "5a85578034cf2a5f7c4256dd43861ed910ab9ee4ea102e09dac183cd010f24e4"),
    ("math-l5/Meta-Llama-3.1-8B-Instruct.json", 3920310,
     "891f1ebeaee41a82972fbe1944fc3cd808e8e6beedf6314f34550ea42e4f2e5d"),
    ("math-l5/Mistral-Large-2.json", 1703428,
     "6c2561cd14bc9bd10718346af478ba9ffa6d8582f3ddd30fa95157bbcebd5817"),
    ("math-l5/Qwen2-72B-Instruct.json", 1618786,
     "c111420f784c96e38ccf56fc29051835d045dac322fbfd8da7d69c127baaaba7"),
    ("math-l5/claude-3-5-haiku-20241022.json", 1826323,
     "3cb6821162f39c5f96e48e866280adf888aea1a25ca4883832ce0f7a94f734fe"),
    ("math-l5/claude-3-5-sonnet-20241022.json", 1575059,
     "61c0070e68a007e8f80f5c280a5444f2bb4f6e906d83db5122847a3f0015afb3"),
    ("math-l5/claude-3-haiku-20240307.json", 1610747,
     "af89a0494cda05230190fff7bbcba34e06cbe57cb9403c4e61273d7e406f9f85"),
    ("math-l5/deepseek-v2.5-0908.json", 1815662,
     "11f2a1c7599c632bab24ddb04907ecba3bdc5bbd24973bd4e3896ecc5b6c88d2"),
    ("math-l5/gemini-1.5-flash.json", 1630679,
     "c4f17eb692a82fc5e201ac79e2751b671179bdefa2f6abd92cba57dfdee22f07"),
    ("math-l5/gemini-1.5-pro.json", 1612901,
     "202f1084b5855148200872a5a69b0a01f7deaf0a68bcd223c00acfcefd052dc5"),
    ("math-l5/gemma-2-9b-it.json", 1744943,
     "5d93441ca6653c9c41af9e5b07cd6be48d4a311825083a6d10ccfb34ade34a80"),
    ("math-l5/gpt-3.5-turbo-0125.json", 1340826,
     "a303bfe3ed8469c0d60b04cb2bb490e4b90af5f5b48a18b6d8353659ead63856"),
    ("math-l5/gpt-4o-2024-08-06.json", 2112358,
     "2deb8ca2007e2195b8ba6cdb1089097ccb88d901facc554d185a262cb4de4d13"),
    ("math-l5/gpt-4o-mini-2024-07-18.json", 2135895,
     "fe3b014a9ea5a896eafde5d39b6a4f2a337c4d3ddefd1a7df5cffad48a82fee1"),
    ("math-l5/o1-mini-2024-09-12.json", 1503460,
     "08594fb7ae132f9275860a1c63d6adb5c3c58d51e70e33e56c3324eace167a6a"),
)
ZEROEVAL_FILES = RemoteDataset(
    name="zeroeval",
    base_url=f"https://raw.githubusercontent.com/WildEval/ZeroEval/{ZEROEVAL_COMMIT}/result_dirs",
    files=tuple(
        RemoteFile(name, sha256, size, remote_path=name.replace("@", "%40") if "@" in name else None)
        for name, size, sha256 in _MANIFEST
    ),
    source=f"GitHub WildEval/ZeroEval at commit {ZEROEVAL_COMMIT}, result_dirs/ (Apache-2.0)",
)
_QUESTION_FIELD = {"gsm": "question", "math-l5": "problem", "crux": "question"}
_NUMBER_RE = re.compile(r"-?\d+(\.\d+)?")
_BOXED_RE = re.compile(r"\\boxed{([\w\d]+)}")


@dataclasses.dataclass(frozen=True)
class Record:
    """One model's recorded call on one question: the prompt it was sent and the text it wrote."""

    prompt: str
    output: str


def data_dir(configured: str | os.PathLike | None = None) -> Path:
    """The directory holding the zeroeval files, by `env.tasks.data_files`' lookup order (`configured`, then
    `$CONDUCTOR_DATA_DIR`, the user cache, the team copy); fetched into the cache first where none holds them."""
    return locate(ZEROEVAL_FILES, configured)


def zeroeval_answer(output: str, model: str) -> str | None:
    """The `answer` ZeroEval reads from a recorded output (`src/evaluation/eval_utils.py` at ZEROEVAL_COMMIT): the
    first complete `{...}` if it parses as JSON with an `answer`; else the first `"answer": "..."` (or unquoted value,
    or unquoted key) by regular expression; else, for a Llama-3.1 `model`, a `\\boxed{word}` when
    "boxed" is in the last 30 characters. A JSON value is turned into text by `str`, as ZeroEval does."""
    parsed = _first_complete_json(output)
    if isinstance(parsed, dict) and "answer" in parsed:
        return str(parsed["answer"])
    found = _answer_by_pattern(output)
    if found is not None:
        return found
    if "Llama-3.1" in model and "boxed" in output[-30:]:
        match = _BOXED_RE.search(output)
        if match:
            return match.group(1)
    return None


def _first_complete_json(text: str) -> object | None:
    """The first balanced `{...}` of `text` parsed as JSON with its newlines removed; None if it does not parse (the
    search stops at the first balanced object, as ZeroEval's does)."""
    depth, start = 0, None
    for index, char in enumerate(text):
        if char == "{":
            if depth == 0:
                start = index
            depth += 1
        elif char == "}" and depth:
            depth -= 1
            if depth == 0:
                try:
                    return json.loads(text[start : index + 1].replace("\n", ""))
                except json.JSONDecodeError:
                    return None
    return None


def _answer_by_pattern(text: str) -> str | None:
    for pattern, flags in (
        (r'"answer"\s*:\s*"([^"]*?)"', 0),
        (r'"answer"\s*:\s*"(.*?)"', re.DOTALL),
        (r'"answer"\s*:\s*([^,\s]*)', 0),
        (r"answer\s*:\s*([^,\s]*)", 0),
    ):
        match = re.search(pattern, text, flags)
        if match:
            return match.group(1)
    return None


def crux_answer(answer: str) -> str:
    """A CRUXEval answer as ZeroEval compares it: surrounding quotes stripped, newlines written as `\\n`."""
    return answer.strip("'\"").replace("\n", "\\n")


def grade_crux(response_text: str, gold: str) -> float:
    """CRUXEval-O, ZeroEval's rule: the answer equals the reference once quotes are stripped from both."""
    answer = extract_answer(response_text)
    return float(answer is not None and crux_answer(answer) == gold.strip("'\""))


def zeroeval_grade(task: str, answer: str | None, gold: str) -> bool:
    """ZeroEval's own verdict on an answer (`src/evaluation/{math,crux}_eval.py`): for GSM8K and MATH, the first
    number of each (after dropping `$` and `,`, and evaluating an `a/b` fraction) is equal; for CRUXEval, `grade_crux`'s
    rule. No answer is wrong."""
    if answer is None:
        return False
    if task == "crux":
        return crux_answer(answer) == gold.strip("'\"")
    first = _NUMBER_RE.search(_sanitized(answer)), _NUMBER_RE.search(_sanitized(gold))
    return bool(first[0] and first[1] and float(first[0].group()) == float(first[1].group()))


def _sanitized(answer: str) -> str:
    text = answer.replace("$", "").strip().replace(",", "")
    fraction = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*/\s*(-?\d+(?:\.\d+)?)\s*", text)
    if fraction and float(fraction.group(2)) != 0:
        return str(float(fraction.group(1)) / float(fraction.group(2)))
    return text


def gold_answer(task: str, record: Mapping[str, object]) -> str:
    """The reference answer of a record (GSM8K's is written `# 18`)."""
    answer = str(record["answer"])
    return answer.replace("#", "").strip() if task == "gsm" else answer


def published_accuracy(task: str, directory: str | os.PathLike | None = None) -> dict[str, float]:
    """{model: accuracy in percent} of ZeroEval's `<task>.summary.json` for the models of this world that have a row."""
    rows = json.loads((Path(directory or data_dir()) / f"{task}.summary.json").read_text(encoding="utf-8"))
    by_name = {row["Model"]: float(row["Acc"]) for row in rows if row.get("Mode") == "greedy"}
    return {
        model: by_name[_SUMMARY_NAMES.get(model, model)]
        for model in ZEROEVAL_MODELS
        if _SUMMARY_NAMES.get(model, model) in by_name
    }


def load_records(
    task: str, directory: str | os.PathLike | None = None, models: Sequence[str] = ZEROEVAL_MODELS
) -> tuple[list[dict], dict[str, dict[object, Record]]]:
    """The questions of `task` in the reference model's file order (its raw records), and {model: {question id:
    Record}} for every model (a model's file may lack questions)."""
    if task not in ZEROEVAL_TASKS:
        raise ValueError(f"unknown zeroeval task {task!r}; tasks: {', '.join(ZEROEVAL_TASKS)}")
    folder = Path(directory or data_dir()) / task
    questions = _read(folder / f"{_REFERENCE_MODEL}.json")
    records = {}
    for model in models:
        if model not in ZEROEVAL_MODELS:
            raise ValueError(f"unknown zeroeval model {model!r}")
        raw = questions if model == _REFERENCE_MODEL else _read(folder / f"{model}.json")
        records[model] = {row["id"]: Record("".join(row["chat_history"]), row["output"][0]) for row in raw}
    return questions, records


def _read(file: Path) -> list[dict]:
    if not file.is_file():
        raise FileNotFoundError(f"no zeroeval file {file}; `python -m launch.data fetch zeroeval`")
    rows = json.loads(file.read_text(encoding="utf-8"))
    if not isinstance(rows, list) or any(not {"id", "chat_history", "output", "answer"} <= set(r) for r in rows):
        raise ValueError(f"{file} must hold a JSON list of ZeroEval records (id, chat_history, output, answer)")
    return rows


def split_indices(task: str, count: int, split: str, seed: int = 0) -> list[int]:
    """The question indices of `split` ("train", "test" or "all") of a task of `count` questions: a permutation drawn
    from `random.Random(f"zeroeval-split/{seed}/{task}")`, its first half (rounded down) the test split and the rest
    the train split, each returned in question order."""
    if split == "all":
        return list(range(count))
    if split not in ("train", "test"):
        raise ValueError(f"split must be train, test or all, got {split!r}")
    order = list(range(count))
    random.Random(f"zeroeval-split/{seed}/{task}").shuffle(order)
    chosen = order[: count // 2] if split == "test" else order[count // 2 :]
    return sorted(chosen)


def load_zeroeval(
    task: str,
    path: str | os.PathLike | None = None,
    *,
    split: str = "all",
    split_seed: int = 0,
    models: Sequence[str] = ZEROEVAL_MODELS,
) -> list[Task]:
    """Tasks of one ZeroEval task (`path`: the directory holding `<task>/`, default `data_dir()`), each carrying the
    recorded calls of `models` in `metadata["records"]`."""
    questions, records = load_records(task, path, models)
    grader = grade_crux if task == "crux" else grade_math
    tasks = []
    for index in split_indices(task, len(questions), split, split_seed):
        row = questions[index]
        tasks.append(
            Task(
                id=f"zeroeval/{task}/{index}",
                task_label=task,
                question=f"{str(row[_QUESTION_FIELD[task]]).strip()}\n\n{ANSWER_INSTRUCTION}",
                gold=gold_answer(task, row),
                grader=grader,
                metadata={"records": {m: records[m][row["id"]] for m in models if row["id"] in records[m]}},
            )
        )
    return tasks
