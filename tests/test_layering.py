"""The packages import one another only downwards (docs/design.md section 1): `models` and `env` import none of ours,
`rl` and `rollout` only `models`, `conductor` (the Conductor application: its terms and transforms over the general
`rl`, and the libraries the entry points run) those below it, and only `launch` imports `launch`. `launch` holds
entry points only, besides its flag groups, benchmark suites and flagfiles, and only it defines absl flags.

Every import of every module of the installed packages is read from its syntax tree: `import x`, `from x import y`,
relative imports, imports inside functions or `if TYPE_CHECKING:`, and `importlib.import_module("x")` with a literal
name.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("models", "rl", "rollout", "env", "conductor", "sweeps", "launch")
# The packages of ours each package may import, besides its own.
MAY_IMPORT = {
    "models": (),
    "env": (),
    "rl": ("models",),
    "rollout": ("models",),
    "conductor": ("models", "rl", "rollout", "env"),
    "sweeps": ("rl",),
    "launch": ("models", "rl", "rollout", "env", "conductor", "sweeps"),
}


def _module_name(path: Path, root: Path) -> list[str]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imported_modules(tree: ast.AST, package: list[str]) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `tree`, relative ones resolved against `package` (the
    dotted package the module belongs to, as a list of its parts)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                found.append((node.lineno, node.module))
                continue
            if node.level - 1 > len(package):
                found.append((node.lineno, "." * node.level + (node.module or "") + " (beyond the top level)"))
                continue
            base = package[: len(package) - (node.level - 1)]
            if node.module:
                found.append((node.lineno, ".".join([*base, node.module])))
            else:  # `from . import x`: each name may be a module of the base package (or a package, at the top)
                found += [(node.lineno, ".".join([*base, alias.name])) for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "importlib"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def layering_violations(root: Path) -> list[str]:
    """'path:line: package imports module' for each import, in the packages under `root`, that crosses the layering."""
    violations = []
    for package in OURS:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            module = _module_name(path, root)
            package_parts = module if path.name == "__init__.py" else module[:-1]
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for line, imported in _imported_modules(tree, package_parts):
                top = imported.split(".")[0]
                if top in OURS and top != package and top not in MAY_IMPORT[package]:
                    violations.append(f"{path.relative_to(root)}:{line}: {package} imports {imported}")
    return violations


def test_no_package_imports_across_the_layering():
    violations = layering_violations(ROOT)
    assert not violations, "imports against docs/design.md section 1:\n" + "\n".join(violations)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_every_kind_of_import_across_the_layering_is_found(tmp_path):
    _write(tmp_path, {
        "models/__init__.py": "from models.config import Config\nfrom . import config\n",
        "models/config.py": "import numpy\n\n\ndef load():\n    from rl import losses\n    return losses\n",
        "env/__init__.py": "",
        "env/tasks/__init__.py": "from .. import launch_helpers\nfrom ... import launch\n",
        "env/tasks/load.py": "import importlib\n\nimportlib.import_module('rollout.types')\n",
        "rl/__init__.py": "",
        "rl/loop.py": "from models import Transformer\nfrom . import losses\nfrom .losses import grpo\n"
                      "from ..env.worlds import World\n",
        "rl/losses.py": "import typing\nif typing.TYPE_CHECKING:\n    import launch.train\n",
        "rollout/__init__.py": "",
        "rollout/sync.py": "import models.hf_io, rl.learner\n",
        "rl/advantages.py": "from conductor.advantages import ROUTE\nimport env\n",
        "conductor/__init__.py": "import rl, env, rollout, models\n",
        "conductor/losses.py": "from launch import train\n",
        "launch/__init__.py": "",
        "launch/train.py": "import conductor, env, models, rl, rollout\nfrom launch import common\nfrom . import common\n",
        "launch/common.py": "from rl.loop import Environment\n",
        "tests/test_x.py": "import launch.train\n",  # outside the packages: tests may import anything
    })
    assert layering_violations(tmp_path) == [
        "models/config.py:5: models imports rl",
        "rl/advantages.py:1: rl imports conductor.advantages",
        "rl/advantages.py:2: rl imports env",
        "rl/loop.py:4: rl imports env.worlds",
        "rl/losses.py:3: rl imports launch.train",
        "rollout/sync.py:1: rollout imports rl.learner",
        "env/tasks/__init__.py:2: env imports launch",
        "env/tasks/load.py:3: env imports rollout.types",
        "conductor/losses.py:1: conductor imports launch",
    ]


@pytest.mark.parametrize(
    "package, source, expected",
    [
        (["rl"], "from . import losses", "rl.losses"),
        (["env", "tasks"], "from ..workers import cache", "env.workers"),
        (["env", "tasks"], "from ...launch import train", "launch"),
        ([], "from . import launch", "launch"),
        (["rl"], "from ... import x", "... (beyond the top level)"),
    ],
)
def test_relative_imports_resolve_against_their_package(package, source, expected):
    [(line, imported)] = _imported_modules(ast.parse(source), package)
    assert line == 1 and imported.startswith(expected)


# What launch/ holds besides its entry points (each a module run as `python -m launch.NAME`).
LAUNCH_FOLDERS = ("benchmark_suites", "configs", "flag_groups")


def _defines_flags(tree: ast.AST) -> list[int]:
    """Lines of `flags.DEFINE_*(...)` calls (absl's, under any name it is imported as) in `tree`."""
    return [
        node.lineno for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.startswith("DEFINE")
    ]


def launch_layout_violations(root: Path) -> list[str]:
    """What in `root`'s launch/ is neither an entry point nor one of LAUNCH_FOLDERS, and every absl flag defined in
    another package."""
    violations = []
    for path in sorted((root / "launch").iterdir()):
        if path.name in ("__init__.py", "__pycache__") or path.name in LAUNCH_FOLDERS:
            continue
        if path.suffix != ".py":
            violations.append(f"launch/{path.name}: not an entry point, a flag group, a suite or a flagfile")
        elif 'if __name__ == "__main__":' not in path.read_text(encoding="utf-8"):
            violations.append(f"launch/{path.name}: a library module, not an entry point (its place: conductor/)")
    for package in OURS:
        if package == "launch":
            continue
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            violations += [f"{path.relative_to(root)}:{line}: defines an absl flag" for line in _defines_flags(tree)]
    return violations


def test_launch_holds_entry_points_and_only_launch_defines_flags():
    violations = launch_layout_violations(ROOT)
    assert not violations, "against docs/design.md section 1:\n" + "\n".join(violations)


def test_a_library_module_in_launch_and_a_flag_outside_it_are_found(tmp_path):
    _write(tmp_path, {
        "launch/__init__.py": "",
        "launch/train.py": "from absl import app, flags\n_X = flags.DEFINE_integer('x', 1, '')\n"
                           "if __name__ == \"__main__\":\n    app.run(print)\n",
        "launch/flag_groups/loop.py": "from absl import flags\nflags.DEFINE_string('y', None, '')\n",
        "launch/generators.py": "def build_generator():\n    return None\n",
        "launch/notes.txt": "",
        "conductor/console.py": "from absl import flags as f\n\n\nLOGS = f.DEFINE_boolean('logs', False, '')\n",
        "rl/loop.py": "import absl.flags\nabsl.flags.FLAGS.mark_as_parsed()\n",
    })
    assert launch_layout_violations(tmp_path) == [
        "launch/generators.py: a library module, not an entry point (its place: conductor/)",
        "launch/notes.txt: not an entry point, a flag group, a suite or a flagfile",
        "conductor/console.py:4: defines an absl flag",
    ]


APPLICATION_WORDS = re.compile(r"\b(route|routes|routing|worker|workers|stratum|strata|domain|domains)\b", re.IGNORECASE)


def application_words(root: Path) -> list[str]:
    """'path:line: word' for each Conductor word (routes, workers, task labels) in a file under `root`/rl: the general
    GRPO library names none of them (docs/design.md section 1); the Conductor's terms live in `conductor/`."""
    found = []
    for path in sorted((root / "rl").rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{path.relative_to(root)}:{number}: {m.group(0)}" for m in APPLICATION_WORDS.finditer(line)]
    return found


def test_rl_names_no_routes_workers_or_task_labels():
    found = application_words(ROOT)
    assert not found, "Conductor words in the general library:\n" + "\n".join(found)


def test_a_conductor_word_in_rl_is_found(tmp_path):
    _write(tmp_path, {
        "rl/loss.py": "def f(route_ids):  # fine: an identifier part, not the word\n    return 1\n",
        "rl/loop.py": "# the Worker pool\nx = 1  # per domain\n",
        "rl/README.md": "Strata are balanced.\n",
        "conductor/terms.py": "# routes and workers belong here\n",
    })
    assert application_words(tmp_path) == ["rl/README.md:1: Strata", "rl/loop.py:1: Worker", "rl/loop.py:2: domain"]


def unlisted_scripts(root: Path) -> list[str]:
    """The files of `root`/scripts that docs/scripts.md does not name: what stays in scripts/ is a maintained tool,
    listed there; a one-off measurement lives in its log entry instead."""
    listed = (root / "docs" / "scripts.md").read_text(encoding="utf-8")
    return [path.name for path in sorted((root / "scripts").iterdir())
            if path.is_file() and not path.name.startswith("__") and f"scripts/{path.name}" not in listed
            and f"scripts.{path.stem} " not in listed]


def test_every_script_is_listed_in_the_scripts_page():
    assert unlisted_scripts(ROOT) == []


def test_an_unlisted_script_is_found(tmp_path):
    _write(tmp_path, {
        "docs/scripts.md": "| `python scripts/kept.py DIR` | ... |\n| `python -m scripts.module_tool --x` | ... |\n",
        "scripts/kept.py": "", "scripts/module_tool.py": "", "scripts/one_off_ab.py": "", "scripts/__init__.py": "",
    })
    assert unlisted_scripts(tmp_path) == ["one_off_ab.py"]
