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


def bits_to_int(bits: np.ndarray) -> int:
    """The integer of little-endian ``bits`` (a 1-D array of 0/1)."""
    return int((bits[::-1].astype(np.uint8) + 48).tobytes().decode() or "0", 2)


def int_to_bits(value: int) -> list[int]:
    """``value``'s little-endian binary digits without leading zeros (``0`` -> ``[0]``)."""
    return [int(c) for c in reversed(f"{value:b}")]


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

    def short_answer(self, value: int, n: int) -> list[int]:
        """The answer for an input of ``n <= 2`` symbols holding ``value``."""
        raise NotImplementedError

    def _sample(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        n, g, width = self.seq_len, generator, self.output_length(self.seq_len)
        if n <= 2:
            values = torch.randint(0, 2**n - 1, (num_samples,), generator=g)
            inputs = (values.unsqueeze(1) >> torch.arange(n)) & 1
            answers = [self.short_answer(int(v), n) for v in values]
        else:
            len_a = torch.randint(1, n - 1, (num_samples,), generator=g)
            len_b = n - 1 - len_a
            a = nonzero_bits(g, len_a, n)
            b = nonzero_bits(g, len_b, n)
            pos = torch.arange(n)
            from_b = b.gather(1, (pos - len_a.unsqueeze(1) - 1).clamp_min(0))
            after = pos > len_a.unsqueeze(1)
            inputs = torch.where(pos < len_a.unsqueeze(1), a, torch.where(after, from_b, SEP))
            a_np, b_np = a.numpy(), b.numpy()
            answers = [
                int_to_bits(self.operate(bits_to_int(a_np[i, :la]), bits_to_int(b_np[i, :lb])))
                for i, (la, lb) in enumerate(zip(len_a.tolist(), len_b.tolist()))
            ]
        lengths = torch.tensor([len(r) for r in answers], dtype=torch.long)
        padded = torch.zeros(num_samples, width, dtype=torch.long)
        for i, r in enumerate(answers):
            padded[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        return inputs, terminated(padded, lengths, width, END)


@register_task("binary_addition")
class BinaryAddition(_BinaryOperation):
    """The sum of two little-endian binary numbers; ``n + 1`` answer slots."""

    def output_length(self, n: int) -> int:
        return n + 1

    def operate(self, a: int, b: int) -> int:
        return a + b

    def short_answer(self, value: int, n: int) -> list[int]:
        return int_to_bits(value)


@register_task("binary_multiplication")
class BinaryMultiplication(_BinaryOperation):
    """The product of two little-endian binary numbers; ``n`` answer slots."""

    def output_length(self, n: int) -> int:
        return n

    def operate(self, a: int, b: int) -> int:
        return a * b

    def short_answer(self, value: int, n: int) -> list[int]:
        return [0] * (n - 1)


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
        width = self.output_length(n)
        rows = little.numpy()
        roots = [math.isqrt(bits_to_int(rows[i])) for i in range(num_samples)]
        shifts = torch.arange(width - 1, -1, -1)
        out = torch.tensor([[(r >> int(s)) & 1 for s in shifts] for r in roots], dtype=torch.long)
        return little.flip(1), out.reshape(num_samples, width)
