"""The README and BUILD_NOTES stay scannable (issue 63): the README at most 150 lines with both commands CI runs, and
BUILD_NOTES' "Current results" at most 25 rows, no cell over 300 characters, each row with its command, commit,
machine and a link to a log entry that exists.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_LINES = 150
RESULT_ROWS = 25
CELL_CHARS = 300
COLUMNS = ["what", "value", "goal", "command", "commit", "machine", "date", "log"]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def results_table(notes: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the first table under "## Current results"."""
    section = re.split(r"^## Current results\n", notes, maxsplit=1, flags=re.M)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    if not lines:
        raise ValueError('"Current results" holds no table')
    return _cells(lines[0]), [_cells(line) for line in lines[2:]]


def bound_violations(header: list[str], rows: list[list[str]]) -> list[str]:
    """What breaks the table's bounds, one line per problem: row count, cell length, a missing column or link."""
    problems = []
    if header != COLUMNS:
        problems.append(f"columns {header}, expected {COLUMNS}")
    if len(rows) > RESULT_ROWS:
        problems.append(f"{len(rows)} rows, at most {RESULT_ROWS}")
    for number, row in enumerate(rows, start=1):
        if len(row) != len(header):
            problems.append(f"row {number}: {len(row)} cells, expected {len(header)}")
            continue
        cells = dict(zip(header, row))
        problems += [f"row {number}, {name}: {len(cell)} characters" for name, cell in cells.items() if len(cell) > CELL_CHARS]
        problems += [f"row {number}: no {name}" for name in ("command", "commit", "machine") if cells[name] in ("", "-")]
        links = re.findall(r"\]\((docs/log/[^)]+\.md)\)", cells["log"])
        if not links:
            problems.append(f"row {number}: no link to a log entry")
        problems += [f"row {number}: {link} does not exist" for link in links if not (ROOT / link).is_file()]
    return problems


def test_readme_is_short_and_keeps_the_two_commands_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_LINES
    for name in ("main", "tests"):
        assert re.search(r"<!-- ci:%s -->\s*```bash\n.+?\n```" % name, readme, re.S), name


def test_readme_links_only_pages_that_exist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#]+)\)", readme)
    assert "docs/flags.md" in targets
    assert [target for target in targets if not (ROOT / target).exists()] == []


def test_current_results_hold_their_bounds():
    header, rows = results_table((ROOT / "BUILD_NOTES.md").read_text(encoding="utf-8"))
    assert rows, "the table has no rows"
    assert bound_violations(header, rows) == []


def test_open_items_are_one_line_bullets():
    notes = (ROOT / "BUILD_NOTES.md").read_text(encoding="utf-8")
    block = notes.split("\nOpen:\n", 1)[1].split("\n\n", 1)[0]
    assert all(line.startswith("- ") for line in block.splitlines()), block


def _table(*rows: str) -> str:
    header = "| " + " | ".join(COLUMNS) + " |"
    return "## Current results\n\n" + "\n".join([header, "|---" * len(COLUMNS) + "|", *rows]) + "\n\n## Decisions\n"


GOOD_ROW = "| a | 1.0 | - | `python -m x` | abc1234 | AMD EPYC | 2026-12-05 | [log](docs/log/README.md) |"


def test_a_good_table_passes():
    assert bound_violations(*results_table(_table(GOOD_ROW))) == []


@pytest.mark.parametrize(
    "rows, problem",
    [
        ([GOOD_ROW] * 26, "26 rows, at most 25"),
        ([GOOD_ROW.replace("| 1.0 |", "| " + "9" * 301 + " |")], "row 1, value: 301 characters"),
        ([GOOD_ROW.replace("| abc1234 |", "| - |")], "row 1: no commit"),
        ([GOOD_ROW.replace("[log](docs/log/README.md)", "none")], "row 1: no link to a log entry"),
        ([GOOD_ROW.replace("docs/log/README.md", "docs/log/nowhere.md")], "row 1: docs/log/nowhere.md does not exist"),
        ([GOOD_ROW.replace(" 2026-12-05 |", "")], "row 1: 7 cells, expected 8"),
    ],
    ids=["rows", "cell", "commit", "no-link", "dead-link", "cells"],
)
def test_each_broken_bound_is_named(rows, problem):
    assert problem in bound_violations(*results_table(_table(*rows)))


def test_a_notes_file_without_a_table_is_refused():
    with pytest.raises(ValueError, match="no table"):
        results_table("## Current results\n\nnothing yet\n\n## Decisions\n")
