"""The mixer registry: names -> factories, plus ``module.path:Attr`` resolution.

A factory is any callable ``factory(d_model: int, **config) -> nn.Module`` whose module maps
``(B, L, d_model) -> (B, L, d_model)`` causally. ``build_mixer`` also accepts
``"module.path:Attr"``: an ``RNNCell`` subclass is turned into a mixer with
``mixers.cells.cell_mixer``; any other callable is used as the factory itself.
"""

from __future__ import annotations

import importlib
from typing import Callable

from torch import nn

MixerFactory = Callable[..., nn.Module]

MIXERS: dict[str, MixerFactory] = {}


def register_mixer(name: str) -> Callable[[MixerFactory], MixerFactory]:
    """Decorator adding ``factory`` to ``MIXERS`` under ``name`` (names are unique)."""

    def add(factory: MixerFactory) -> MixerFactory:
        if name in MIXERS and MIXERS[name] is not factory:
            raise ValueError(f"mixer {name!r} is already registered (by {MIXERS[name]!r})")
        MIXERS[name] = factory
        return factory

    return add


def _import_attr(spec: str) -> object:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"mixer {spec!r}: expected 'module.path:Attr'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"mixer {spec!r}: cannot import module {module_name!r} ({err})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"mixer {spec!r}: module {module_name!r} has no attribute {attr!r}") from None


def resolve_mixer(name: str) -> MixerFactory:
    """Return the factory for a registered name or a ``module.path:Attr`` spec.

    Raises ``ValueError`` listing the registered names when ``name`` is unknown.
    """
    if name in MIXERS:
        return MIXERS[name]
    if ":" in name:
        obj = _import_attr(name)
        if isinstance(obj, type) and hasattr(obj, "recurrence_step"):
            from mixers.cells import cell_mixer  # a user's RNNCell subclass

            def factory(d_model: int, **config) -> nn.Module:
                return cell_mixer(obj, d_model=d_model, **config)

            return factory
        if callable(obj):
            return obj
        raise ValueError(f"mixer {name!r} is neither an RNNCell subclass nor a callable")
    known = ", ".join(sorted(MIXERS))
    raise ValueError(f"unknown mixer {name!r}; known mixers: {known} (or 'module.path:CellClass')")


def build_mixer(name: str, d_model: int, **config) -> nn.Module:
    """Build the mixer ``name`` for width ``d_model`` with keyword ``config`` overrides."""
    if not isinstance(d_model, int) or d_model <= 0:
        raise ValueError(f"d_model must be a positive int, got {d_model!r}")
    return resolve_mixer(name)(d_model, **config)
