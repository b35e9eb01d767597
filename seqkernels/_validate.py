"""Checks of the kernels' integer options (``seqkernels`` imports nothing of the suite, so it keeps its own
copy of the few it needs; the mixers' are in ``mixers/validate.py``). Each returns the value or raises a
one-line ``ValueError`` naming the option and the value; ``bool`` is not an int here.
"""

from __future__ import annotations


def is_int(value) -> bool:
    """Whether ``value`` is an ``int`` and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(name: str, value) -> int:
    """``value`` if it is an int >= 1."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def non_negative_int(name: str, value) -> int:
    """``value`` if it is an int >= 0."""
    if not is_int(value) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value
