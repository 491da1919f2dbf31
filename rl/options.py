"""Options of registered functions: a registered function's keyword-only parameters are its options.

An estimator (`rl.advantages.ESTIMATORS`), an advantage transform (`rl.advantages.ADVANTAGE_TRANSFORMS`) and an
auxiliary loss term (`rl.auxiliary.AUXILIARY_TERMS`) each take their hyperparameters as keyword-only parameters with
defaults. A configuration names the function and gives some of them; `check_options` checks each given name against
the signature and each value against its annotation (a `Literal` lists the accepted values), so a misspelt or
mistyped option fails where the configuration is built, not when the function first runs.
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any, Callable, Container, Literal, Mapping


def accepted_options(function: Callable[..., Any], data: Container[str] = ()) -> dict[str, Any]:
    """`function`'s options, each with its default: its keyword-only parameters but those named in `data` (inputs a
    caller fills from the batch, not from a configuration)."""
    return {
        parameter.name: parameter.default
        for parameter in inspect.signature(function).parameters.values()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.name not in data
    }


def has_type(value: Any, annotation: Any) -> bool:
    """Whether `value` fits an option's annotation: a Literal's values, bool, int, float (an int fits), str, None,
    a tuple of one of those (`tuple[int, ...]`), or a union of those."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return value in typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(has_type(value, member) for member in typing.get_args(annotation))
    if origin is tuple:
        member, ellipsis = (typing.get_args(annotation) + (None, None))[:2]
        if ellipsis is not Ellipsis:
            raise TypeError(f"an option annotated {annotation!r} cannot be checked; use tuple[T, ...]")
        return isinstance(value, tuple) and all(has_type(item, member) for item in value)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation in (bool, str):
        return isinstance(value, annotation)
    raise TypeError(
        f"an option annotated {annotation!r} cannot be checked; use a Literal, bool, int, float, str, None or "
        "tuple[T, ...]"
    )


def check_options(
    kind: str, name: str, function: Callable[..., Any], options: Mapping[str, Any], data: Container[str] = ()
) -> None:
    """Raises ValueError unless every option is one `function` (the `kind` registered as `name`, for the message)
    takes, with a value its annotation accepts."""
    accepted = accepted_options(function, data)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"{kind} {name!r} takes no option {', '.join(map(repr, unknown))}; it takes {sorted(accepted) or 'none'}"
        )
    hints = typing.get_type_hints(function)
    for option, value in options.items():
        if not has_type(value, hints[option]):
            choices = typing.get_args(hints[option]) or getattr(hints[option], "__name__", hints[option])
            raise ValueError(
                f"{kind} {name!r}: option {option!r} must be {choices}, got {value!r}; it takes {sorted(accepted)}"
            )
