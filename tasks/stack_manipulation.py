"""Stack manipulation (deterministic context-free; Deletang et al. 2023, ``dcf/stack_manipulation.py``).

Input: a stack of bits given bottom to top (``k`` symbols, ``k`` uniform in ``[1, n-1]``; ``k = n`` for
``n = 1``), then ``n - k`` actions uniform over ``POP = 2``, ``PUSH 0 = 3``, ``PUSH 1 = 4`` (a POP on
the empty stack does nothing). Output (``n + 1`` answer slots, ``tasks.transduction``): the final
stack top to bottom, then the termination symbol ``2``; the slots after it are ``-100`` (Deletang pads
them with 0 and masks them out of the accuracy). Classes: 3; vocabulary: 5 + the answer token.
"""

from __future__ import annotations

import dataclasses

import torch

from tasks.base import check, register_task
from tasks.transduction import Transduction, terminated

POP, PUSH0, PUSH1 = 2, 3, 4
END = 2


@dataclasses.dataclass
class StackManipulationConfig:
    #: the input's length, stack and actions (Deletang's length)
    seq_len: int = 40


@register_task("stack_manipulation")
class StackManipulation(Transduction):
    """Run stack actions on a given stack, answer the final stack top to bottom; see the module docstring."""

    Config = StackManipulationConfig

    @property
    def symbols(self) -> int:
        return 5

    @property
    def num_classes(self) -> int:
        return 3

    def output_length(self, n: int) -> int:
        return n + 1

    def _validate(self) -> None:
        check(self.config.seq_len >= 1, self.name, f"seq_len must be >= 1, got {self.config.seq_len}")

    def _sample(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        n, rows = self.seq_len, num_samples
        if n == 1:
            initial = torch.ones(rows, dtype=torch.long)
        else:
            initial = torch.randint(1, n, (rows,), generator=generator)
        bits = torch.randint(0, 2, (rows, n), generator=generator)
        actions = torch.randint(POP, PUSH1 + 1, (rows, n), generator=generator)
        pos = torch.arange(n)
        inputs = torch.where(pos < initial.unsqueeze(1), bits, actions)
        # run the stack: a push writes at the height and raises it, a pop lowers it (not below 0)
        stack = torch.zeros(rows, n, dtype=torch.long)
        height = torch.zeros(rows, dtype=torch.long)
        every = torch.arange(rows)
        for t in range(n):
            x = inputs[:, t]
            push = x != POP
            value = torch.where(x >= PUSH0, x - PUSH0, x)
            stack[every[push], height[push]] = value[push]
            height = torch.where(push, height + 1, (height - 1).clamp_min(0))
        top_first = stack.gather(1, (height.unsqueeze(1) - 1 - pos).clamp_min(0))
        return inputs, terminated(top_first, height, n + 1, END)
