"""Solve equation (deterministic context-free; Deletang et al. 2023, ``dcf/solve_equation.py``).

An input of length ``n >= 3`` is ``E = v``: ``E`` a bracketed expression of ``n - 2`` tokens mod
``modulus`` with ``+`` and ``-`` only (``modular_arithmetic_brackets`` with ``mult=False``, Deletang's
recursion), one of its digits replaced by the unknown ``x``, and ``v`` the value of ``E`` before the
replacement. The label, at the last position (``v``), is the replaced digit: the unique solution (without
``*`` no factor 0 can absorb ``x``). Which digit: a position uniform over ``E``'s, then the first digit
from there on, wrapping around (Deletang's choice; digits after long runs of brackets and operators are
picked more often). ``n < 3``: ``n`` tokens ``0`` and the label 0 (Deletang's convention).

Tokens: digits ``0 .. m-1``, ``+ = m``, ``- = m+1``, ``* = m+2`` (never drawn: the ids of
``modular_arithmetic_brackets``), ``( = m+3``, ``) = m+4``, ``x = m+5``, ``= = m+6``; vocabulary ``m + 7``.
Classes ``modulus``, chance ``1/modulus``. Deletang reads the label after the input at one extra answer
token; here it is at the last position.
"""

from __future__ import annotations

import dataclasses

import torch

from tasks.base import IGNORE_INDEX, Task, TaskData, check, register_task
from tasks.modular_arithmetic import ModularArithmeticBrackets

UNKNOWN, EQUALS = 5, 6  # offsets above the digits


@dataclasses.dataclass
class SolveEquationConfig:
    seq_len: int = 40
    modulus: int = 5


@register_task("solve_equation")
class SolveEquation(Task):
    """Find the digit that ``x`` replaces in ``E = v``; see the module docstring."""

    Config = SolveEquationConfig

    @property
    def vocab_size(self) -> int:
        return self.config.modulus + 7

    @property
    def num_classes(self) -> int:
        return self.config.modulus

    def _validate(self) -> None:
        c = self.config
        check(c.seq_len >= 1, self.name, f"seq_len must be >= 1, got {c.seq_len}")
        check(
            isinstance(c.modulus, int) and not isinstance(c.modulus, bool) and c.modulus >= 2,
            self.name,
            f"modulus must be an int >= 2, got {c.modulus!r}",
        )

    def _generate(self, num_samples: int, generator: torch.Generator) -> TaskData:
        n, m = self.seq_len, self.config.modulus
        targets = torch.full((num_samples, n), IGNORE_INDEX, dtype=torch.long)
        if n < 3:
            targets[:, -1] = 0
            return TaskData(torch.zeros(num_samples, n, dtype=torch.long), targets)
        expression = ModularArithmeticBrackets(seq_len=n - 2, modulus=m, mult=False).generate(num_samples, generator)
        tokens, value = expression.inputs, expression.targets[:, -1]
        # the first digit at or after a uniform start, wrapping around: rotate, take the first digit
        start = torch.randint(0, n - 2, (num_samples, 1), generator=generator)
        order = (start + torch.arange(n - 2)) % (n - 2)
        is_digit = tokens.gather(1, order) < m
        chosen = order.gather(1, is_digit.long().argmax(dim=1, keepdim=True))
        targets[:, -1] = tokens.gather(1, chosen).squeeze(1)
        equation = tokens.scatter(1, chosen, m + UNKNOWN)
        tail = torch.stack([torch.full_like(value, m + EQUALS), value], dim=1)
        return TaskData(torch.cat([equation, tail], dim=1), targets)
