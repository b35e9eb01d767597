"""``build_mixer(name, d_model, **config)``: a mixer from a registered name or a ``module.path:Attr``.

``module.path:Attr`` may name an ``RNNCell`` subclass (turned into a mixer by
``mixers.cells.cell_mixer``) or any factory callable; ``fla:<Layer>`` a layer of flash-linear-attention
(``mixers.fla_layers``). The result must be an ``nn.Module``.
"""

from __future__ import annotations

from torch import nn

from mixers.fla_layers import PREFIX as FLA_PREFIX
from mixers.fla_layers import fla_factory
from mixers.registry import MIXERS, MixerFactory, import_attr


def resolve_mixer(name: str) -> MixerFactory:
    """Return the factory for a registered name or a ``module.path:Attr`` spec.

    Raises ``ValueError`` listing the registered names when ``name`` is unknown.
    """
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
    if not isinstance(d_model, int) or d_model <= 0:
        raise ValueError(f"d_model must be a positive int, got {d_model!r}")
    module = resolve_mixer(name)(d_model, **config)
    if not isinstance(module, nn.Module):
        raise ValueError(f"mixer {name!r} built a {type(module).__name__}, not an nn.Module mapping (B, L, d) to (B, L, d)")
    return module
