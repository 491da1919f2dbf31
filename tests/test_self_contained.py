"""The repository stands alone: no file points into a `shared` folder beside it, and the design it cites is its own.

The one exception is the data lookup's last fallback (a `shared/data` folder in the directory that holds the checkout,
the team's offline copy from before `python -m launch.data fetch` existed): the lines of the one function that builds
that path, in one of the data lookup's modules, may name it. Every other file is scanned, the notes and the experiment
log included: a command there that once ran from that folder is written as the data lookup finds the files now.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
# The data lookup (`env.tasks.data_files`), and the RouterDC loader, where the lookup lived before it.
FALLBACK_MODULES = ("env/tasks/data_files.py", "env/tasks/routerdc.py")
# Used when git is absent (a source archive): the folders .gitignore names, which hold no sources.
_UNTRACKED_DIRS = {".git", "__pycache__", ".pytest_cache", ".hypothesis", ".venv", "runs", "build", "dist"}

# The design beside the repository, never allowed.
_DESIGN_POINTER = re.compile(r"shared/DESIG[N]")
# The folder beside the repository: written as a relative path, or built from a string literal that is exactly the
# folder's name (a path component, as in `parent / <literal> / ...`), which reaches it without the relative path.
_FOLDER_POINTER = re.compile(r"\.\./shared\b|([\"'])shared\1")
_CITATION = re.compile(r"docs/design\.md,? sections? (\d+)(?: and (\d+))?")
_BARE_CITATION = re.compile(r"\bDESIGN(?:\.md)? sections?")  # the old file's name, with no path


def _repository_files() -> list[str]:
    """Tracked files plus new ones git does not ignore; every file but ignored folders when git is absent."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        listed = []
        for folder, subfolders, files in os.walk(ROOT):
            subfolders[:] = [name for name in subfolders if name not in _UNTRACKED_DIRS and "egg-info" not in name]
            listed += [Path(folder, name).relative_to(ROOT).as_posix() for name in files]
    return sorted(name for name in set(listed) if (ROOT / name).is_file())


def _text(name: str) -> str | None:
    raw = (ROOT / name).read_bytes()
    if b"\0" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def pointer_lines(text: str) -> list[tuple[int, str, bool]]:
    """(line number, line, whether it names the design) of each line pointing into the folder beside the repo."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        names_design = bool(_DESIGN_POINTER.search(line))
        if names_design or _FOLDER_POINTER.search(line):
            found.append((number, line.strip(), names_design))
    return found


def fallback_functions(source: str) -> dict[str, set[int]]:
    """Lines of each function whose code (not its docstring) builds a path into the folder beside the repo."""
    functions: dict[str, set[int]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        docstring = node.body[0] if isinstance(node.body[0], ast.Expr) else None
        builds = any(
            isinstance(inner, ast.Constant) and isinstance(inner.value, str) and pointer_lines(repr(inner.value))
            for statement in node.body if statement is not docstring
            for inner in ast.walk(statement)
        )
        if builds:
            functions[node.name] = set(range(node.lineno, node.end_lineno + 1))
    return functions


def _fallbacks() -> dict[tuple[str, str], set[int]]:
    """(module, function) -> lines, for each function of `FALLBACK_MODULES` that builds the fallback path."""
    found = {}
    for module in FALLBACK_MODULES:
        if (ROOT / module).is_file():
            source = (ROOT / module).read_text(encoding="utf-8")
            found |= {(module, name): lines for name, lines in fallback_functions(source).items()}
    return found


def test_no_file_points_into_a_folder_beside_the_repository():
    allowed = {(module, n) for (module, _), lines in _fallbacks().items() for n in lines}
    offending = []
    for name in _repository_files():
        if (text := _text(name)) is None:
            continue
        for number, line, names_design in pointer_lines(text):
            if names_design or (name, number) not in allowed:
                offending.append(f"{name}:{number}: {line}")
    if offending:
        pytest.fail("pointers outside the repository (cite docs/design.md; data comes from `python -m launch.data "
                    "fetch`):\n" + "\n".join(offending))


def test_the_data_fallback_is_built_in_one_function():
    assert len(_fallbacks()) <= 1, f"the data fallback is built by {sorted(_fallbacks())}; keep it in one function"


def test_the_scan_finds_each_form_of_pointer_and_allows_only_the_building_function():
    # Written with a placeholder so that this file passes its own scan.
    sample = "\n".join([
        "See ../SHARED/data/routerdc for the files.",  # 1: the relative path
        "The design: ../SHARED/DESIGN.md.",  # 2: the design
        'root = Path(__file__).parents[2] / "SHARED" / "data"',  # 3: built from a component
        "root = os.path.join(up, 'SHARED', 'data')",  # 4: the same with os.path
        "a SHARED prompt, SHARED_memory, ../SHARED_cache, /work/SHARED_not, 'SHARED data'",  # 5: no pointer
    ]).replace("SHARED", "SHARED".lower())
    assert [(number, names_design) for number, _, names_design in pointer_lines(sample)] == [
        (1, False), (2, True), (3, False), (4, False)
    ]
    module = "\n".join([
        '"""Data lives in ../SHARED/data."""',  # 1: the module docstring builds nothing
        "",
        "def data_dir():",  # 3
        '    """Else ../SHARED/data beside the repository."""',  # 4
        '    return Path(__file__).parents[2] / "SHARED" / "data"',  # 5
        "",
        "def documented_only():",  # 7
        '    """Reads ../SHARED/data (a docstring builds nothing)."""',  # 8
        "    return None",
    ]).replace("SHARED", "SHARED".lower())
    assert fallback_functions(module) == {"data_dir": {3, 4, 5}}


def test_every_citation_of_the_design_names_one_of_its_sections():
    assert DESIGN.is_file(), f"the repository's design {DESIGN} is missing"
    headings = set(re.findall(r"^## (\d+)\. ", DESIGN.read_text(encoding="utf-8"), flags=re.MULTILINE))
    assert headings >= {str(n) for n in range(1, 9)}, f"{DESIGN} lacks numbered sections: {sorted(headings)}"
    unknown = []
    for name in _repository_files():
        if (text := _text(name)) is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            for match in _CITATION.finditer(line):
                unknown += [f"{name}:{number}: section {s}" for s in match.groups() if s and s not in headings]
            if _BARE_CITATION.search(line):
                unknown.append(f"{name}:{number}: cites the design without its path docs/design.md")
    if unknown:
        pytest.fail("citations of missing design sections:\n" + "\n".join(unknown))
