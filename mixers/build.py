"""``build_mixer(name, d_model, **config)``: a mixer from a registered name or a ``module.path:Attr``.

``module.path:Attr`` may name an ``RNNCell`` subclass (turned into a mixer by
``mixers.cells.cell_mixer``) or any factory callable; ``fla:<Layer>`` a layer of flash-linear-attention
(``mixers.fla_layers``); any of them may carry options, ``name[key=value,...]``. The result must be an
``nn.Module``.

A mixed stack, ``"mlstm_exp+slstm"`` (``split_stack``), names one mixer per layer of a model, repeated
(layer ``i`` uses part ``i % len(parts)``); the model builds it (``experiments.trial.model``), not
``build_mixer``.
"""

from __future__ import annotations

import ast
import functools

from torch import nn

from mixers.fla_layers import PREFIX as FLA_PREFIX
from mixers.fla_layers import fla_factory
from mixers.registry import MIXERS, MixerFactory, import_attr
from mixers.validate import positive_int


def split_options(name: str) -> tuple[str, dict[str, object]]:
    """``"deltaproduct[householders=4,signed=false]"`` -> ``("deltaproduct", {"householders": 4, "signed": False})``:
    a mixer name may carry options, so one sweep holds several variants of a mixer as cells of their own.
    Values are Python literals (``true``/``false``/``none`` too); anything else stays a string."""
    if not name.endswith("]") or "[" not in name:
        return name, {}
    base, _, inner = name[:-1].partition("[")
    options: dict[str, object] = {}
    for item in filter(None, (x.strip() for x in inner.split(","))):
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"mixer {name!r}: expected name[key=value,...], got {item!r}")
        text = text.strip()
        lowered = {"true": True, "false": False, "none": None, "null": None}
        try:
            value = lowered[text.lower()] if text.lower() in lowered else ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        options[key.strip()] = value
    return base, options


def split_stack(name: str) -> list[str]:
    """``"mlstm_exp+slstm"`` -> ``["mlstm_exp", "slstm"]``: the parts of a mixed stack, split on ``+``
    outside ``[...]`` options (a plain mixer name gives itself). One-line ``ValueError`` for an empty part."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(name):
        depth += (char == "[") - (char == "]")
        if char == "+" and depth == 0:
            parts.append(name[start:i])
            start = i + 1
    parts.append(name[start:])
    if len(parts) > 1 and not all(p.strip() for p in parts):
        raise ValueError(f"mixer stack {name!r}: expected MIXER+MIXER[+...], got an empty part")
    return [p.strip() for p in parts]


def resolve_mixer(name: str) -> MixerFactory:
    """Return the factory for a registered name, a ``module.path:Attr`` spec or ``fla:<Layer>``; a name with
    options (``name[key=value,...]``, ``split_options``) gives the factory with those options set.

    Raises ``ValueError`` listing the registered names when ``name`` is unknown.
    """
    if len(split_stack(name)) > 1:
        raise ValueError(
            f"mixer {name!r} is a stack of {len(split_stack(name))} mixers, one per layer: the model builds it "
            "(--layers a multiple of its length), not build_mixer"
        )
    base, options = split_options(name)
    if options or base != name:
        factory = resolve_mixer(base)
        return functools.partial(factory, **options)
    if name in MIXERS:
        return MIXERS[name]
    if name.startswith(FLA_PREFIX):
        return fla_factory(name)
    if ":" in name:
        obj = import_attr(name)
        if isinstance(obj, type) and hasattr(obj, "recurrence_step"):
            from mixers.cells import cell_mixer  # a user's RNNCell subclass

            def factory(d_model: int, **config) -> nn.Module:
                return cell_mixer(obj, d_model=d_model, **config)

            return factory
        if callable(obj):
            return obj
        raise ValueError(f"mixer {name!r} is neither an RNNCell subclass nor a callable")
    known = ", ".join(sorted(MIXERS))
    raise ValueError(f"unknown mixer {name!r}; known mixers: {known} (or 'module.path:CellClass', 'fla:<Layer>')")


def build_mixer(name: str, d_model: int, **config) -> nn.Module:
    """Build the mixer ``name`` for width ``d_model`` with keyword ``config`` overrides."""
    positive_int("d_model", d_model)
    module = resolve_mixer(name)(d_model, **config)
    if not isinstance(module, nn.Module):
        raise ValueError(
            f"mixer {name!r} built a {type(module).__name__}, not an nn.Module mapping (B, L, d) to (B, L, d)"
        )
    return module
