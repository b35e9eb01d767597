"""Multi-query associative recall.

Layout: ``k1 v1 k2 v2 ... kκ vκ`` then queries interleaved with filler. Keys come from
``[1, V/2)`` (token 0 is never a key), values from ``[V/2, V)``, both distinct within a sequence.
The target at a query position is the value paired with that key; every other position is ``-100``.

Placements of the queries after the context:

- ``uniform`` (ours): one query per key at uniform distinct positions, then every other position a
  query with probability ``query_rate``; filler uniform over the vocabulary minus the context keys.
- ``power`` (ours): one query per key, at distinct positions after the context drawn with a power law
  ``p(gap) ∝ a gap^(a-1)`` over every position (odd and even); filler as ``uniform``'s, never a key.
- ``zoology``: Zoology's generator (Arora et al. 2023, HazyResearch/zoology
  ``zoology/data/multiquery_ar.py``, ``multiquery_ar``): one query per key, only at even offsets ``2 s``
  after the context, the slot ``s`` drawn without replacement from ``[0, (L - 2κ) / 2)`` with
  ``p(s) ∝ a (s + 1)^(a-1)``; every other position filler uniform over the whole vocabulary
  (``random_non_queries=True``, the generator's default), so context keys reappear unscored, or token 0
  (``random_non_queries=False``, the setting of Zoology's Figure 2 configs,
  ``zoology/experiments/paper_configs/iclr24_zoology_figure2/configs.py``). Needs an even
  ``seq_len >= 4κ`` (Zoology's asserts).
"""

from __future__ import annotations

import dataclasses

import torch

from tasks.base import IGNORE_INDEX, Task, TaskData, check, random_subsets, register_task

PLACEMENTS = ("uniform", "power", "zoology")


@dataclasses.dataclass
class MQARConfig:
    seq_len: int = 100
    vocab_size: int = 128
    #: number of key-value pairs (the papers' κ)
    num_kv_pairs: int = 2
    #: probability that a position after the context is a query (placement="uniform")
    query_rate: float = 0.25
    #: "uniform": one query per key at random positions, then each other position is a query with
    #: probability query_rate; "power": one query per key only, positions drawn with a power law
    #: concentrated right after the context (ours); "zoology": Zoology's generator (module docstring)
    placement: str = "uniform"
    power_a: float = 0.01
    #: placement="zoology" only: filler uniform over the vocabulary (True, Zoology's default) or token 0
    #: (False, as Zoology's Figure 2 configs); Zoology's name for the option
    random_non_queries: bool = True


def _without(values: torch.Tensor, excluded_sorted: torch.Tensor) -> torch.Tensor:
    """Map ``values`` in ``[0, V - k)`` to the tokens of ``[0, V)`` not in ``excluded_sorted``.

    ``excluded_sorted (N, k)`` must be ascending per row; ``values (N, M)``. Walking the excluded
    tokens in ascending order and shifting past each one keeps the map a bijection.
    """
    out = values.clone()
    for j in range(excluded_sorted.shape[1]):
        out += (out >= excluded_sorted[:, j : j + 1]).long()
    return out


@register_task("mqar")
class MQAR(Task):
    """Multi-query associative recall with ``num_kv_pairs`` pairs. Classes: V."""

    Config = MQARConfig
    answer_positions = "every"  # each query its own recall

    @property
    def chance_accuracy(self) -> float:
        """``2 / V``: a guess uniform over the ``V/2`` value tokens, the only targets (values are uniform).

        A model that copies one of the κ context values at random, without associating, scores ``1/κ``;
        that is the floor of associative recall proper, not chance.
        """
        return 1.0 / (self.config.vocab_size - self.config.vocab_size // 2)

    def _validate(self) -> None:
        c = self.config
        kappa, half = c.num_kv_pairs, c.vocab_size // 2
        check(
            c.vocab_size >= 4 and c.vocab_size % 2 == 0,
            self.name,
            f"vocab_size must be even and >= 4, got {c.vocab_size}",
        )
        check(kappa >= 1, self.name, f"num_kv_pairs must be >= 1, got {kappa}")
        check(
            kappa < half,
            self.name,
            f"needs num_kv_pairs < vocab_size/2 (keys come from [1, V/2)), got {kappa} >= {half}",
        )
        check(
            3 * kappa <= c.seq_len,
            self.name,
            f"needs 3*num_kv_pairs <= seq_len (context + one query per key), got 3*{kappa} > {c.seq_len}",
        )
        check(0.0 <= c.query_rate <= 1.0, self.name, f"query_rate must be in [0, 1], got {c.query_rate}")
        check(
            c.placement in PLACEMENTS,
            self.name,
            f"placement must be one of {', '.join(PLACEMENTS)}, got {c.placement!r}",
        )
        check(c.power_a > 0, self.name, f"power_a must be > 0, got {c.power_a}")
        check(
            c.random_non_queries or c.placement == "zoology",
            self.name,
            f"random_non_queries=False needs placement zoology (the other placements draw their own filler), "
            f"got placement {c.placement!r}",
        )
        if c.placement == "zoology":
            check(
                c.seq_len % 2 == 0 and 4 * kappa <= c.seq_len,
                self.name,
                f"placement zoology needs an even seq_len >= 4*num_kv_pairs, got seq_len {c.seq_len}, "
                f"num_kv_pairs {kappa}",
            )

    def _query_positions(self, g: torch.Generator, n: int, rest: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(mandatory positions (n, κ) in [0, rest), extra-query mask (n, rest))."""
        c, kappa = self.config, self.config.num_kv_pairs
        if c.placement == "uniform":
            mandatory = random_subsets(g, n, rest, kappa)
            extra = torch.rand(n, rest, generator=g) < c.query_rate
            return mandatory, extra
        # a power law over every position after the context: p(gap) ∝ a * gap^(a-1), gap = 1..rest
        gaps = torch.arange(1, rest + 1, dtype=torch.float64)
        weights = (c.power_a * gaps ** (c.power_a - 1)).expand(n, rest)
        mandatory = torch.multinomial(weights, kappa, replacement=False, generator=g)
        return mandatory, torch.zeros(n, rest, dtype=torch.bool)

    def _zoology(self, g: torch.Generator, keys: torch.Tensor, values: torch.Tensor) -> TaskData:
        """Zoology's layout (module docstring) around the context ``keys``/``values`` (``(N, κ)`` each)."""
        c, (n, kappa) = self.config, keys.shape
        slots = torch.arange(1, (c.seq_len - 2 * kappa) // 2 + 1, dtype=torch.float64)
        weights = (c.power_a * slots ** (c.power_a - 1)).expand(n, len(slots))
        position = 2 * kappa + 2 * torch.multinomial(weights, kappa, replacement=False, generator=g)
        if c.random_non_queries:
            inputs = torch.randint(0, c.vocab_size, (n, c.seq_len), generator=g)
        else:
            inputs = torch.zeros(n, c.seq_len, dtype=torch.long)
        inputs[:, : 2 * kappa] = torch.stack([keys, values], dim=2).reshape(n, 2 * kappa)
        inputs.scatter_(1, position, keys)
        targets = torch.full_like(inputs, IGNORE_INDEX).scatter_(1, position, values)
        return TaskData(inputs, targets)

    def _generate(self, num_samples: int, generator: torch.Generator) -> TaskData:
        c, g, n = self.config, generator, num_samples
        kappa, half, length = c.num_kv_pairs, c.vocab_size // 2, c.seq_len
        rest = length - 2 * kappa
        keys = random_subsets(g, n, half - 1, kappa) + 1  # distinct, in [1, V/2)
        values = random_subsets(g, n, c.vocab_size - half, kappa) + half  # distinct, in [V/2, V)
        if c.placement == "zoology":
            return self._zoology(g, keys, values)

        # After the context: noise everywhere, then queries (key index per position) on top.
        noise = _without(torch.randint(0, c.vocab_size - kappa, (n, rest), generator=g), keys.sort(dim=1).values)
        which_key = torch.randint(0, kappa, (n, rest), generator=g)
        mandatory, is_query = self._query_positions(g, n, rest)
        is_query = is_query.clone()
        rows = torch.arange(n).unsqueeze(1)
        is_query[rows, mandatory] = True
        which_key[rows, mandatory] = torch.arange(kappa).expand(n, kappa)

        tail = torch.where(is_query, keys.gather(1, which_key), noise)
        tail_targets = torch.where(is_query, values.gather(1, which_key), torch.full_like(noise, IGNORE_INDEX))
        context = torch.stack([keys, values], dim=2).reshape(n, 2 * kappa)
        inputs = torch.cat([context, tail], dim=1)
        targets = torch.cat([torch.full_like(context, IGNORE_INDEX), tail_targets], dim=1)
        return TaskData(inputs, targets)
