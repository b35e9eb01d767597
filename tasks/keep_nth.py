"""Keep-nth: i.i.d. tokens; the target is the n-th token, at the last position or at every position from n on."""

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
    #: target x_n at every position from the n-th on (dense supervision), not only at the last
    per_position: bool = False


@register_task("keep_nth")
class KeepNth(Task):
    """Target ``x_n`` (1-based). Classes: V; chance 1/V.

    ``per_position=False`` (default): ``x_n`` at the last position only, every other position ``-100``.
    ``per_position=True``: ``x_n`` at every position ``t >= n`` (1-based; position n itself is
    scored: its input is ``x_n``), positions before n ``-100``. Every position whose prefix holds
    ``x_n`` is scored, so the last position is scored in both readings with the same target.
    """

    Config = KeepNthConfig

    def _validate(self) -> None:
        c = self.config
        check(c.vocab_size >= 2, self.name, f"vocab_size must be >= 2, got {c.vocab_size}")
        check(1 <= c.n <= c.seq_len, self.name, f"needs 1 <= n <= seq_len, got n={c.n}, seq_len={c.seq_len}")
        check(
            isinstance(c.per_position, bool), self.name, f"per_position must be True or False, got {c.per_position!r}"
        )

    def _generate(self, num_samples: int, generator: torch.Generator) -> TaskData:
        c = self.config
        tokens = uniform_tokens(generator, (num_samples, c.seq_len), 0, c.vocab_size)
        targets = torch.full_like(tokens, IGNORE_INDEX)
        scored = slice(c.n - 1, None) if c.per_position else slice(-1, None)
        targets[:, scored] = tokens[:, c.n - 1 : c.n]
        return TaskData(tokens, targets)
