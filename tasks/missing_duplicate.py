"""Missing duplicate (context-sensitive; Deletang et al. 2023, ``cs/missing_duplicate_string.py``).

A bit string ``w`` of ``n // 2`` i.i.d. bits written twice, ``w w``, with one position (uniform over the
``2 (n // 2)``) replaced by the placeholder ``2``; an odd ``n`` ends with the pad ``3``. The label, at
the last position, is the hidden bit. ``n = 1``: the input ``1`` and the label 1 (Deletang's
convention). Vocabulary 4, classes 2, chance 1/2. Deletang reads the label after the input at one
extra answer token; here it is at the last position.

``w w`` holds an even number of ones, so the hidden bit is also the parity of the visible bits: a
two-state automaton solves the task at every length, without comparing the halves (the smoke preset's
GRU finds it within 200 steps and scores 100% at twice its training length).
"""

from __future__ import annotations

import dataclasses

import torch

from tasks.base import IGNORE_INDEX, Task, TaskData, check, register_task, uniform_tokens

HIDDEN, PAD = 2, 3


@dataclasses.dataclass
class MissingDuplicateConfig:
    seq_len: int = 40


@register_task("missing_duplicate")
class MissingDuplicate(Task):
    """Find the hidden bit of a duplicated string; see the module docstring."""

    Config = MissingDuplicateConfig

    @property
    def vocab_size(self) -> int:
        return 4

    @property
    def num_classes(self) -> int:
        return 2

    def _validate(self) -> None:
        check(self.config.seq_len >= 1, self.name, f"seq_len must be >= 1, got {self.config.seq_len}")

    def _generate(self, num_samples: int, generator: torch.Generator) -> TaskData:
        n = self.seq_len
        targets = torch.full((num_samples, n), IGNORE_INDEX, dtype=torch.long)
        if n == 1:
            targets[:, 0] = 1
            return TaskData(torch.ones(num_samples, 1, dtype=torch.long), targets)
        half = uniform_tokens(generator, (num_samples, n // 2), 0, 2)
        doubled = torch.cat([half, half], dim=1)
        hidden = torch.randint(0, doubled.shape[1], (num_samples, 1), generator=generator)
        targets[:, -1] = doubled.gather(1, hidden).squeeze(1)
        inputs = doubled.scatter(1, hidden, HIDDEN)
        if n % 2:
            inputs = torch.cat([inputs, torch.full((num_samples, 1), PAD)], dim=1)
        return TaskData(inputs, targets)
