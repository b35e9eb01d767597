"""Modular counting: the running count of one token, mod ``m``.

Tokens are i.i.d. uniform over ``[0, vocab_size)`` (default 2: bits). The target at position ``t``
is ``#{s <= t : x_s == count_token} mod m`` (classes: ``m``); ``running=False`` scores only the last
position. With ``m = 2``, ``vocab_size = 2``, ``count_token = 1`` this is running parity. Chance
for a model that ignores the input: ``1/m``.
"""

from __future__ import annotations

import dataclasses

import torch

from tasks.base import IGNORE_INDEX, Task, TaskData, check, register_task, uniform_tokens


@dataclasses.dataclass
class ModularCountConfig:
    seq_len: int = 100
    #: the modulus (classes)
    m: int = 3
    #: input tokens are uniform over ``[0, vocab_size)``
    vocab_size: int = 2
    #: the token whose occurrences are counted
    count_token: int = 1
    #: target at every position; ``False``: the last position only
    running: bool = True


@register_task("modular_count")
class ModularCount(Task):
    """Count one token mod ``m``; see the module docstring."""

    Config = ModularCountConfig

    @property
    def num_classes(self) -> int:
        return self.config.m

    def _validate(self) -> None:
        c = self.config
        check(c.seq_len >= 1, self.name, f"seq_len must be >= 1, got {c.seq_len}")
        check(c.m >= 2, self.name, f"m must be >= 2, got {c.m}")
        check(c.vocab_size >= 2, self.name, f"vocab_size must be >= 2, got {c.vocab_size}")
        check(
            0 <= c.count_token < c.vocab_size,
            self.name,
            f"count_token must be in [0, vocab_size={c.vocab_size}), got {c.count_token}",
        )

    def _generate(self, num_samples: int, generator: torch.Generator) -> TaskData:
        c = self.config
        tokens = uniform_tokens(generator, (num_samples, c.seq_len), 0, c.vocab_size)
        counts = (tokens == c.count_token).long().cumsum(dim=1) % c.m
        if c.running:
            return TaskData(tokens, counts)
        targets = torch.full_like(tokens, IGNORE_INDEX)
        targets[:, -1] = counts[:, -1]
        return TaskData(tokens, targets)
