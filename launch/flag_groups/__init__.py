"""Flag groups: each module defines the flags of one concern and one `from_flags()` that returns its typed config.

A group maps each config field to the flag that sets it, once, and `from_flags` builds the config from that
mapping (`field_values`), so no field is copied out of a flag by hand. Entry points import the groups they read.
"""

from __future__ import annotations

import typing
from typing import Any, Mapping

from absl import flags


def field_values(fields: Mapping[str, flags.FlagHolder]) -> dict[str, Any]:
    """Each config field's value, read from the flag that sets it."""
    return {field: holder.value for field, holder in fields.items()}


def field_choices(config_type: type, field: str) -> list[str]:
    """The values the `Literal` type of `config_type.field` admits: a flag's choices, never a second list."""
    choices = typing.get_args(typing.get_type_hints(config_type)[field])
    if not choices:
        raise TypeError(f"{config_type.__name__}.{field} is not a Literal")
    return list(choices)
