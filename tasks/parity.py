"""Parity: i.i.d. bits; the target is the running parity at every position, or the parity of all bits at the last."""

from __future__ import annotations

import dataclasses

import torch

from tasks.base import IGNORE_INDEX, Task, TaskData, check, register_task, uniform_tokens


@dataclasses.dataclass
class ParityConfig:
    seq_len: int = 100
    #: target at every position is the running parity (dense supervision)
    running: bool = False


@register_task("parity")
class Parity(Task):
    """Tokens are bits {0, 1}; target ``sum(bits) mod 2`` at the last position (or running)."""

    Config = ParityConfig

    @property
    def vocab_size(self) -> int:
        return 2

    @property
    def num_classes(self) -> int:
        return 2

    def _validate(self) -> None:
        check(self.config.seq_len >= 1, self.name, f"seq_len must be >= 1, got {self.config.seq_len}")

    def _generate(self, num_samples: int, generator: torch.Generator) -> TaskData:
        bits = uniform_tokens(generator, (num_samples, self.config.seq_len), 0, 2)
        running = bits.cumsum(dim=1) & 1
        if self.config.running:
            return TaskData(bits, running)
        targets = torch.full_like(bits, IGNORE_INDEX)
        targets[:, -1] = running[:, -1]
        return TaskData(bits, targets)
