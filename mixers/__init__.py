"""Sequence mixers: ``nn.Module``s mapping ``(B, L, d) -> (B, L, d)`` causally, and a registry.

Importing this package registers every built-in mixer in ``MIXERS``. Conventions: see
``mixers/CONVENTIONS.md``.
"""

# Built-in mixers register themselves on import (one line per module).
import mixers.builtin  # noqa: F401,E402
from mixers.build import build_mixer, resolve_mixer
from mixers.cells import cell_mixer  # noqa: E402
from mixers.registry import MIXERS, register_mixer

__all__ = ["MIXERS", "build_mixer", "cell_mixer", "register_mixer", "resolve_mixer"]
