"""docs/flags.md's table of the flags researchers touch names real `launch.train` flags with their defaults in the code."""

from __future__ import annotations

import pathlib
import re

import pytest
from absl import flags

from launch import train  # noqa: F401  (defines the flags)

FLAGS_PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "flags.md"
HEADER = "| flag | default | what it changes |"
# How the table writes a default of None.
UNSET = {"unset", "whole batch", "mini-batch"}


def _rows() -> list[tuple[list[str], list[str]]]:
    lines = FLAGS_PAGE.read_text().splitlines()
    start = lines.index(HEADER) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        names_cell, default_cell = line.split(" | ")[:2]
        names = re.findall(r"`--(\w+)`", names_cell)
        defaults = default_cell.split(", ")
        if defaults[0].endswith(" each"):
            defaults = [defaults[0].removesuffix(" each")] * len(names)
        rows.append((names, defaults))
    return rows


def _value(text: str):
    if text in UNSET:
        return None
    if text == "none":  # an empty list
        return []
    if text in ("on", "off"):
        return text == "on"
    if text.startswith("`"):
        return text.strip("`")
    return float(text)


def test_the_table_lists_the_flags_researchers_touch():
    names = {name for row_names, _ in _rows() for name in row_names}
    assert {"estimator", "policy_loss", "ppo_epochs", "learning_rate", "generator", "sync"} <= names


@pytest.mark.parametrize("names, defaults", _rows(), ids=lambda value: ",".join(value))
def test_each_row_names_real_flags_with_their_defaults(names, defaults):
    assert len(names) == len(defaults), f"{names}: one default per flag, got {defaults}"
    for name, text in zip(names, defaults):
        default = flags.FLAGS[name].default
        expected = _value(text)
        if isinstance(expected, float):
            assert default == pytest.approx(expected), name
        else:
            assert default == expected, name
