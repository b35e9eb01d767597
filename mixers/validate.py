"""Checks of mixer constructor options: each returns the value or raises a one-line ``ValueError``
that names the option and the value (CONVENTIONS: "Bad input"). ``name`` is the option as the user
wrote it, with the mixer's prefix where the message carries one (``"mamba2: conv_kernel"``).
``bool`` is rejected where an int is asked for (``True`` is an ``int`` to Python).
"""

from __future__ import annotations

from collections.abc import Iterable


def is_int(value) -> bool:
    """Whether ``value`` is an ``int`` and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(name: str, value) -> int:
    """``value`` if it is an int >= 1."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def non_negative_int(name: str, value, note: str = "") -> int:
    """``value`` if it is an int >= 0; ``note`` follows the condition in the message (``" (0: off)"``)."""
    if not is_int(value) or value < 0:
        raise ValueError(f"{name} must be an int >= 0{note}, got {value!r}")
    return value


def boolean(name: str, value) -> bool:
    """``value`` if it is ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")  # noqa: TRY004 (CONVENTIONS: bad values)
    return value


def check_backend(mixer: str, value: str, backends: Iterable[str]) -> str:
    """``value`` if it is one of ``backends`` (the mixer's ``BACKENDS``)."""
    backends = tuple(backends)
    if value not in backends:
        raise ValueError(f"{mixer}: unknown backend {value!r}; valid: {', '.join(backends)}")
    return value
