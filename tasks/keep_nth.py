"""Keep-nth (SPEC §3.2): i.i.d. tokens; the target at the last position is the n-th token."""

from __future__ import annotations

import dataclasses

import torch

from tasks.base import IGNORE_INDEX, Task, TaskData, check, register_task, uniform_tokens


@dataclasses.dataclass
class KeepNthConfig:
    seq_len: int = 100
    vocab_size: int = 128
    #: 1-based position of the token to keep (n=5: the fifth token, index 4)
    n: int = 5


@register_task("keep_nth")
class KeepNth(Task):
    """Target ``x_n`` (1-based) at the last position only. Classes: V; chance 1/V."""

    Config = KeepNthConfig

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def num_classes(self) -> int:
        return self.config.vocab_size

    def _validate(self) -> None:
        c = self.config
        check(c.vocab_size >= 2, self.name, f"vocab_size must be >= 2, got {c.vocab_size}")
        check(1 <= c.n <= c.seq_len, self.name, f"needs 1 <= n <= seq_len, got n={c.n}, seq_len={c.seq_len}")

    def _generate(self, num_samples: int, generator: torch.Generator) -> TaskData:
        c = self.config
        tokens = uniform_tokens(generator, (num_samples, c.seq_len), 0, c.vocab_size)
        targets = torch.full_like(tokens, IGNORE_INDEX)
        targets[:, -1] = tokens[:, c.n - 1]
        return TaskData(tokens, targets)
