"""k-hop induction heads.

Tokens are uniform over V with no immediate repeats. For position p, ``prev(p)`` is the most recent
strictly earlier position with the same token and ``τ(p) = prev(p) + 1``. The target at i is
``x[τ^k(i)]``; where some ``prev`` does not exist it is the class ``NONE = V`` (or ``-100`` with
``mask_none=True``). Every position is scored.

Chance (``chance_accuracy``): ``1 / num_classes``. It is ill-defined here: the NONE class dominates
the first positions and fades later, so an input-blind predictor that knows the position beats it.
"""

from __future__ import annotations

import dataclasses

import torch

from tasks.base import IGNORE_INDEX, Task, TaskData, check, register_task

DEFAULT_VOCAB = {1: 10, 2: 5}


@dataclasses.dataclass
class KHopConfig:
    seq_len: int = 100
    k: int = 1
    #: defaults to 10 for k=1 and 5 for k>=2 (the papers' settings)
    vocab_size: int | None = None
    #: score positions whose hops run off the start as -100 instead of the NONE class
    mask_none: bool = False


def hop_targets(tokens: torch.Tensor, vocab_size: int, k: int) -> torch.Tensor:
    """``LongTensor (N, L)``: ``x[τ^k(i)]`` per position, ``-1`` where a hop does not exist."""
    n, length = tokens.shape
    # last_seen[row * V + token] = latest position of token in row so far (-1: none)
    slot = (torch.arange(n).unsqueeze(1) * vocab_size + tokens).t().contiguous()  # (L, N)
    last_seen = torch.full((n * vocab_size,), -1, dtype=torch.long)
    tau = torch.empty(length, n, dtype=torch.long)
    for t in range(length):  # L vectorized steps over the batch
        prev = last_seen.index_select(0, slot[t])
        tau[t] = torch.where(prev >= 0, prev + 1, prev)
        last_seen.index_fill_(0, slot[t], t)
    tau = tau.t()
    pos = torch.arange(length).expand(n, length).clone()
    for _ in range(k):
        valid = pos >= 0
        pos = torch.where(valid, tau.gather(1, pos.clamp_min(0)), pos)
    return torch.where(pos >= 0, tokens.gather(1, pos.clamp_min(0)), torch.full_like(pos, -1))


@register_task("khop")
class KHop(Task):
    """k-hop induction heads. Classes: V + 1 (the last is NONE), or V with ``mask_none``."""

    Config = KHopConfig
    answer_positions = "every"  # each position its own hop

    @property
    def vocab_size(self) -> int:
        c = self.config
        return c.vocab_size if c.vocab_size is not None else DEFAULT_VOCAB.get(c.k, 5)

    @property
    def num_classes(self) -> int:
        return self.vocab_size if self.config.mask_none else self.vocab_size + 1

    def _validate(self) -> None:
        c = self.config
        check(c.k >= 1, self.name, f"k must be >= 1, got {c.k}")
        check(self.vocab_size >= 2, self.name, f"vocab_size must be >= 2 (no immediate repeats), got {self.vocab_size}")
        check(c.seq_len >= 1, self.name, f"seq_len must be >= 1, got {c.seq_len}")

    def _generate(self, num_samples: int, generator: torch.Generator) -> TaskData:
        v, length = self.vocab_size, self.config.seq_len
        first = torch.randint(0, v, (num_samples, 1), generator=generator)
        steps = torch.randint(1, v, (num_samples, length - 1), generator=generator)  # never 0: no repeats
        tokens = torch.cat([first, steps], dim=1).cumsum(dim=1) % v
        hopped = hop_targets(tokens, v, self.config.k)
        none = IGNORE_INDEX if self.config.mask_none else v
        return TaskData(tokens, torch.where(hopped >= 0, hopped, torch.full_like(hopped, none)))
