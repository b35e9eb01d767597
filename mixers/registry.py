"""The mixer registry: names -> factories (``MIXERS``, ``register_mixer``), and ``import_attr`` for
``module.path:Attr`` names. Building a mixer from a name: ``mixers.build``.

A factory is any callable ``factory(d_model: int, **config) -> nn.Module`` whose module maps
``(B, L, d_model) -> (B, L, d_model)`` causally.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

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


def import_attr(spec: str) -> object:
    """The attribute ``Attr`` of module ``module.path`` named by ``"module.path:Attr"`` (one-line ``ValueError``)."""
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
