"""Typed options: a sweep's task, training, extrapolation and mixer options parsed to the type their
target declares, or refused in one line naming the option and its value.

The values come from ``KEY=VALUE`` on the command line (read as YAML: ``running=maybe`` is the string
``'maybe'``) or from a preset. The declared types are the fields of the config dataclasses (a task's
``Config``, ``TrainConfig``, ``ExtrapolationConfig``) and the parameters of a mixer's factory (their
annotations, else the type of their default; a factory's ``**config`` is followed to the class it
returns). Accepted besides the declared type: an integer where a float is declared (kept as written: a
cell's hash covers its options), a number written as a string where YAML leaves one (``1e-3``: a
float), ``none``/``null`` where ``None`` is allowed (``None``), a list where a tuple is declared (kept a
list).
Everything else of the wrong type is refused: ``task option running=maybe (parity): expected true or
false``. Options a target does not declare (a mixer's ``**config`` passed on) are left as they are.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import types
import typing
from typing import Any

_NONE_WORDS = ("none", "null")


class _Mismatch(Exception):
    """``value`` does not fit the declared type (caught by ``typed_options``, which names the option)."""


def describe(tp: Any) -> str:
    """What a value of type ``tp`` looks like, for the error message."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        kinds = [describe(a) for a in args if a is not type(None)]
        return " or ".join(kinds) + (" or none" if type(None) in args else "")
    if origin is typing.Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin in (tuple, list):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} {_plural(args[0])}, e.g. [{', '.join(_example(a, i) for i, a in enumerate(args))}]"
        item = args[0] if args else Any
        return f"a list of {_plural(item)}, e.g. [{_example(item, 0)}, {_example(item, 1)}]"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def _plural(tp: Any) -> str:
    return {bool: "booleans", int: "integers", float: "numbers", str: "strings"}.get(tp, "values")


def _example(tp: Any, i: int) -> str:
    return {int: ("16", "64"), float: ("0.5", "1.5"), bool: ("true", "false"), str: ("a", "b")}.get(tp, ("...",) * 2)[
        i % 2
    ]


def coerce(value: Any, tp: Any) -> Any:
    """``value`` as type ``tp``; raises ``_Mismatch`` if it is not one (see the module docstring)."""
    if tp in (Any, inspect.Parameter.empty, object) or isinstance(tp, (str, typing.TypeVar)):
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and (value is None or (isinstance(value, str) and value.lower() in _NONE_WORDS)):
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is typing.Literal:
        if value in args:
            return value
        raise _Mismatch
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise _Mismatch
            items = [coerce(v, a) for v, a in zip(value, args)]
        else:
            items = [coerce(v, args[0] if args else Any) for v in value]
        return type(value)(items)  # a list stays a list: the target converts, the cell hash sees it as written
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value  # an integer stays one: a cell's hash covers its options as written
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise _Mismatch from None
        raise _Mismatch
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    return value  # a type this module does not check (a dict, a class): the target checks it


def show(value: Any) -> str:
    """``value`` as it would be typed after ``KEY=``: a string bare, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def typed_options(options: dict[str, Any], declared: dict[str, Any], kind: str) -> dict[str, Any]:
    """``options`` with each declared key's value parsed to its type (``coerce``); one-line ``ValueError``
    ``"{kind} option KEY=VALUE: expected ..."`` for a value that is not of it. Undeclared keys pass as they are."""
    out = dict(options)
    for key, value in options.items():
        if key not in declared:
            continue
        try:
            out[key] = coerce(value, declared[key])
        except _Mismatch:
            raise ValueError(f"{kind} option {key}={show(value)}: expected {describe(declared[key])}") from None
    return out


def dataclass_types(config: type) -> dict[str, Any]:
    """The declared type of every field of the dataclass ``config`` (string annotations resolved)."""
    hints = typing.get_type_hints(config)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(config)}


def signature_types(fn: Any) -> dict[str, Any]:
    """The declared type of each keyword parameter of ``fn`` (its annotation, else its default's type;
    ``Any`` for neither); where ``fn`` takes ``**config`` and names a class it returns, that class's too."""
    try:
        sig = inspect.signature(fn, eval_str=True)
    except (TypeError, ValueError, NameError):
        return {}
    declared: dict[str, Any] = {}
    passes_on = False
    for name, param in sig.parameters.items():
        if param.kind is param.VAR_KEYWORD:
            passes_on = True
        elif param.kind is not param.VAR_POSITIONAL:
            declared[name] = _parameter_type(param)
    returned = sig.return_annotation
    if passes_on and isinstance(returned, type) and returned.__module__.split(".")[0] != "torch":
        declared = {**signature_types(returned), **declared}
    return declared


def _parameter_type(param: inspect.Parameter) -> Any:
    if param.annotation is not param.empty:
        return param.annotation
    default = param.default
    if default is param.empty or default is None:
        return Any
    return float if type(default) is float else type(default) if type(default) in (bool, int, str) else Any
