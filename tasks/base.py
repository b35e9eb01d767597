"""Task base class, the data container and the task registry.

Conventions: inputs and targets are ``LongTensor (N, L)``; targets hold class ids in
``[0, num_classes)`` or ``-100`` (``IGNORE_INDEX``) at unscored positions. Generation is vectorized
and deterministic in ``seed``: it never touches torch's global RNG.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch

IGNORE_INDEX = -100

SeedLike = int | torch.Generator


def make_generator(seed: SeedLike, *stream: int) -> torch.Generator:
    """A CPU generator for ``seed`` (an int) and an optional stream id (e.g. the split).

    Streams are derived with ``numpy.random.SeedSequence`` so ``(seed, 0)`` and ``(seed, 1)`` never
    share state; the same ints give the same generator on any machine. A ``torch.Generator`` passes
    through unchanged.
    """
    if isinstance(seed, torch.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int or a torch.Generator, got {seed!r}")
    state = np.random.SeedSequence([int(seed), *map(int, stream)]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


@dataclasses.dataclass
class TaskData:
    """A generated data set: ``inputs``/``targets`` are ``LongTensor (N, L)``.

    ``lengths`` (``LongTensor (N,)``) is set when sequences are right-padded to a common length.
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    lengths: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.inputs.shape[0]


class Task:
    """A synthetic task: a config dataclass plus a vectorized ``generate``.

    Subclasses define ``Config`` (a dataclass with defaults and a ``seq_len`` field), ``_validate`` and
    ``_generate(num_samples, generator)``, and ``vocab_size`` / ``num_classes`` / ``chance_accuracy``
    where the defaults (the config's ``vocab_size``; one class per token; ``1 / num_classes``) do not fit.
    """

    name: ClassVar[str]
    Config: ClassVar[type]
    #: How the scored positions make up the answer: ``"last"`` (the last scored position holds the answer
    #: over the whole input: a single label, or a running value whose last position is the hardest; the
    #: ``last_acc`` metric reads it) or ``"every"`` (each scored position is an answer of its own: the
    #: symbols of a string answered after the input, ``tasks.transduction``, or MQAR's queries; the
    #: per-position ``acc`` averages them). The expressivity map picks its metric per task from it.
    answer_positions: ClassVar[str] = "last"

    def __init__(self, **overrides: Any) -> None:
        fields = {f.name for f in dataclasses.fields(self.Config)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ValueError(
                f"task {self.name!r}: unknown option(s) {', '.join(unknown)}; valid: {', '.join(sorted(fields))}"
            )
        self.config = self.Config(**overrides)
        self._validate()

    # --- subclass interface -------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Input tokens are ids in ``[0, vocab_size)``; default: the config's ``vocab_size``."""
        if not hasattr(self.config, "vocab_size"):
            raise NotImplementedError(f"{type(self).__name__} must define vocab_size")
        return self.config.vocab_size

    @property
    def num_classes(self) -> int:
        """Targets are class ids in ``[0, num_classes)``; default: one class per token."""
        return self.vocab_size

    @property
    def chance_accuracy(self) -> float:
        """The token accuracy of guessing, for the scaled accuracy ``(acc - chance) / (1 - chance)``.

        Default ``1 / num_classes``: a guess uniform over the classes, which is also what any predictor
        blind to the input scores where the targets are uniform over the classes (parity, word
        problems, counting and modular arithmetic mod m, Keep-nth). Tasks whose targets cover only
        some classes override it (MQAR: only the V/2 value tokens are ever targets). Where targets are
        not uniform (short modular expressions, k-hop's NONE class) the blind optimum is higher; the
        task's docstring says by how much. Grazzi et al. (2025) scale by random guessing in the same way.
        """
        return 1.0 / self.num_classes

    def scaled_accuracy(self, accuracy: float) -> float:
        """``(accuracy - chance) / (1 - chance)``: 0 at chance, 1 when perfect, negative below chance."""
        chance = self.chance_accuracy
        return (accuracy - chance) / (1.0 - chance)

    def _validate(self) -> None:
        raise NotImplementedError

    def _generate(self, num_samples: int, generator: torch.Generator) -> TaskData:
        raise NotImplementedError

    # --- public API ---------------------------------------------------------------------
    @property
    def seq_len(self) -> int:
        return self.config.seq_len

    @property
    def total_len(self) -> int:
        """The generated sequences' length: ``seq_len`` plus, for a task that answers with a string after
        its input (``tasks.transduction``), the answer slots."""
        return self.config.seq_len

    def with_options(self, **overrides: Any) -> Task:
        """A copy of this task with some config fields replaced (validated)."""
        return type(self)(**{**dataclasses.asdict(self.config), **overrides})

    def generate(self, num_samples: int, seed: SeedLike = 0) -> TaskData:
        """``num_samples`` sequences of length ``total_len``, deterministic in ``seed``."""
        if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 0:
            raise ValueError(f"num_samples must be a non-negative int, got {num_samples!r}")
        data = self._generate(int(num_samples), make_generator(seed))
        assert data.inputs.shape == data.targets.shape == (num_samples, self.total_len)
        return data

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in dataclasses.asdict(self.config).items())
        return f"{type(self).__name__}({opts})"


TASKS: dict[str, type[Task]] = {}


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    """Class decorator adding a ``Task`` subclass to ``TASKS`` under ``name``."""

    def add(cls: type[Task]) -> type[Task]:
        if name in TASKS and TASKS[name] is not cls:
            raise ValueError(f"task {name!r} is already registered")
        cls.name = name
        TASKS[name] = cls
        return cls

    return add


def get_task(name: str, **overrides: Any) -> Task:
    """Instantiate the task ``name`` with keyword overrides of its config."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name](**overrides)


def check(condition: bool, task: str, message: str) -> None:
    """Raise ``ValueError("task <task>: <message>")`` unless ``condition``."""
    if not condition:
        raise ValueError(f"task {task!r}: {message}")


def uniform_tokens(generator: torch.Generator, shape: tuple[int, ...], low: int, high: int) -> torch.Tensor:
    """i.i.d. uniform ints in ``[low, high)``."""
    return torch.randint(low, high, shape, generator=generator)


def random_subsets(generator: torch.Generator, num_samples: int, population: int, k: int) -> torch.Tensor:
    """``LongTensor (num_samples, k)``: per row, ``k`` distinct values from ``range(population)``.

    Each row is a uniformly random ordered selection (a uniform k-subset in uniform random order).
    Small ``k`` uses Floyd's algorithm (O(k²) vectorized steps), large ``k`` an argsort of noise.
    """
    if not 0 <= k <= population:
        raise ValueError(f"cannot draw {k} distinct values from {population}")
    if k > 16:
        return torch.rand(num_samples, population, generator=generator).argsort(dim=1)[:, :k]
    chosen = torch.empty(num_samples, k, dtype=torch.long)
    for i, j in enumerate(range(population - k, population)):
        t = (torch.rand(num_samples, generator=generator) * (j + 1)).long().clamp_max(j)
        taken = (chosen[:, :i] == t.unsqueeze(1)).any(dim=1)
        chosen[:, i] = torch.where(taken, torch.full_like(t, j), t)
    order = torch.rand(num_samples, k, generator=generator).argsort(dim=1)
    return chosen.gather(1, order)
