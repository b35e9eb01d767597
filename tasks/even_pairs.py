"""Even pairs (regular; Deletang et al. 2023, ``regular/even_pairs.py``): i.i.d. bits; the label, at
the last position, is whether the number of unequal neighbours (``01`` and ``10`` pairs) is odd
(class 1) or even (class 0), that is whether the first and last bits differ. Classes 2, chance 1/2.

Deletang reads the label after the input at one extra answer token; here it is at the last bit, as
parity's (``tasks.parity``).
"""

from __future__ import annotations

import dataclasses

import torch

from tasks.base import IGNORE_INDEX, Task, TaskData, check, register_task, uniform_tokens


@dataclasses.dataclass
class EvenPairsConfig:
    seq_len: int = 40


@register_task("even_pairs")
class EvenPairs(Task):
    """Bits; label: parity of the count of ``01``/``10`` pairs, at the last position."""

    Config = EvenPairsConfig

    @property
    def vocab_size(self) -> int:
        return 2

    def _validate(self) -> None:
        check(self.config.seq_len >= 1, self.name, f"seq_len must be >= 1, got {self.config.seq_len}")

    def _generate(self, num_samples: int, generator: torch.Generator) -> TaskData:
        bits = uniform_tokens(generator, (num_samples, self.seq_len), 0, 2)
        targets = torch.full_like(bits, IGNORE_INDEX)
        targets[:, -1] = (bits[:, 1:] != bits[:, :-1]).sum(dim=1) % 2
        return TaskData(bits, targets)
