"""Binary addition, binary multiplication and the integer square root (context-sensitive; Deletang et
al. 2023, ``cs/binary_addition.py``, ``cs/binary_multiplication.py``, ``cs/compute_sqrt.py``), answered
after the input (``tasks.transduction``).

Addition and multiplication: an input of length ``n >= 3`` is ``a SEP b`` with ``a`` and ``b`` in
little-endian binary, zero-filled to their lengths; ``|a|`` is uniform in ``[1, n-2]``, ``|b| = n-1-|a|``,
each number uniform in ``[1, 2^len - 1]``. ``SEP = 2`` (Deletang's ``+``/``*`` placeholder). The answer is
the sum (``n + 1`` slots) or product (``n`` slots) in little-endian binary without leading zeros (zero is
``0``), then the termination symbol ``2``; later slots ``-100``. For ``n <= 2`` the input is one number
uniform in ``[0, 2^n - 2]`` in ``n`` bits, the sum's answer is that number, the product's ``n - 1`` zeros
(Deletang's conventions). Input symbols 3, classes 3.

Square root: a number uniform in ``[1, 2^n - 1]`` in ``n`` big-endian bits; the answer is
``floor(sqrt(x))`` in ``ceil(n/2)`` big-endian bits. Symbols and classes 2.

The numbers reach ``2^n``: the values are Python integers per row (exact at any length).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from tasks.base import register_task
from tasks.transduction import Transduction, terminated

SEP = END = 2


def row_integers(bits: torch.Tensor) -> list[int]:
    """The integer of each row of little-endian ``bits`` (``LongTensor (N, w)`` of 0/1), exact at any width."""
    n, width = bits.shape
    if width == 0:
        return [0] * n
    text = (bits.flip(1).numpy().astype(np.uint8) + 48).tobytes().decode()
    return [int(text[i * width : (i + 1) * width], 2) for i in range(n)]


def integer_bits(values: list[int], width: int, little_endian: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(bits (N, width), lengths (N,))``: each value's binary digits without leading zeros (``0`` is
    ``0``), little-endian and zero-filled to ``width`` (or big-endian, zero-filled on the left)."""
    digits = [f"{v:b}" for v in values]
    lengths = torch.tensor([len(d) for d in digits], dtype=torch.long)
    if little_endian:
        text = "".join(d[::-1].ljust(width, "0") for d in digits)
    else:
        text = "".join(d.rjust(width, "0") for d in digits)
    flat = np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int64) - 48
    return torch.from_numpy(flat.reshape(len(values), width).copy()), lengths


def nonzero_bits(generator: torch.Generator, lengths: torch.Tensor, width: int) -> torch.Tensor:
    """``LongTensor (N, width)``: per row a number uniform in ``[1, 2^lengths[i] - 1]`` as little-endian
    bits (zero past ``lengths[i]``): uniform bits, rows that came out all zero drawn again."""
    live = torch.arange(width) < lengths.unsqueeze(1)
    bits = torch.randint(0, 2, live.shape, generator=generator) * live
    while True:
        zero = (bits == 0).all(dim=1).nonzero().squeeze(1)
        if not len(zero):
            return bits
        bits[zero] = torch.randint(0, 2, (len(zero), width), generator=generator) * live[zero]


@dataclasses.dataclass
class BinaryConfig:
    #: the input's length: both numbers and the separator (Deletang's length)
    seq_len: int = 40


class _BinaryOperation(Transduction):
    """``a SEP b`` -> ``op(a, b)`` in little-endian binary, terminated; see the module docstring."""

    Config = BinaryConfig

    @property
    def symbols(self) -> int:
        return 3

    def operate(self, a: int, b: int) -> int:
        raise NotImplementedError

    def short_answer(self, value: int, n: int) -> tuple[int, int]:
        """The answer for an input of ``n <= 2`` symbols holding ``value``: (number, digits written)."""
        raise NotImplementedError

    def _sample(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        n, g, width = self.seq_len, generator, self.output_length(self.seq_len)
        if n <= 2:
            values = torch.randint(0, 2**n - 1, (num_samples,), generator=g)
            inputs = (values.unsqueeze(1) >> torch.arange(n)) & 1
            answers, digits = zip(*(self.short_answer(int(v), n) for v in values)) if num_samples else ((), ())
        else:
            len_a = torch.randint(1, n - 1, (num_samples,), generator=g)
            len_b = n - 1 - len_a
            a = nonzero_bits(g, len_a, n)
            b = nonzero_bits(g, len_b, n)
            pos = torch.arange(n)
            from_b = b.gather(1, (pos - len_a.unsqueeze(1) - 1).clamp_min(0))
            after = pos > len_a.unsqueeze(1)
            inputs = torch.where(pos < len_a.unsqueeze(1), a, torch.where(after, from_b, SEP))
            answers = [self.operate(x, y) for x, y in zip(row_integers(a), row_integers(b))]
        bits, lengths = integer_bits(list(answers), width)
        if n <= 2:
            lengths = torch.tensor(digits, dtype=torch.long)
        return inputs, terminated(bits, lengths, width, END)


@register_task("binary_addition")
class BinaryAddition(_BinaryOperation):
    """The sum of two little-endian binary numbers; ``n + 1`` answer slots."""

    def output_length(self, n: int) -> int:
        return n + 1

    def operate(self, a: int, b: int) -> int:
        return a + b

    def short_answer(self, value: int, n: int) -> tuple[int, int]:
        return value, len(f"{value:b}")


@register_task("binary_multiplication")
class BinaryMultiplication(_BinaryOperation):
    """The product of two little-endian binary numbers; ``n`` answer slots."""

    def output_length(self, n: int) -> int:
        return n

    def operate(self, a: int, b: int) -> int:
        return a * b

    def short_answer(self, value: int, n: int) -> tuple[int, int]:
        return 0, n - 1  # n - 1 zeros (Deletang's convention)


@register_task("compute_sqrt")
class ComputeSqrt(Transduction):
    """``floor(sqrt(x))`` of an ``n``-bit big-endian number, in ``ceil(n/2)`` big-endian bits."""

    Config = BinaryConfig

    @property
    def symbols(self) -> int:
        return 2

    def output_length(self, n: int) -> int:
        return math.ceil(n / 2)

    def _sample(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.seq_len
        little = nonzero_bits(generator, torch.full((num_samples,), n), n)
        roots = [math.isqrt(v) for v in row_integers(little)]
        out, _ = integer_bits(roots, self.output_length(n), little_endian=False)
        return little.flip(1), out
