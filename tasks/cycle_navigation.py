"""Cycle navigation (regular; Deletang et al. 2023, ``regular/cycle_navigation.py``): actions i.i.d.
uniform over ``0`` (step left), ``1`` (stay), ``2`` (step right) on a cycle of ``cycle_length`` states
(default 5), starting at state 0; the label, at the last position, is the final state. Classes
``cycle_length``, chance ``1/cycle_length``.

Deletang reads the label after the input at one extra answer token; here it is at the last action.
"""

from __future__ import annotations

import dataclasses

import torch

from tasks.base import IGNORE_INDEX, Task, TaskData, check, register_task, uniform_tokens


@dataclasses.dataclass
class CycleNavigationConfig:
    seq_len: int = 40
    #: the number of states on the cycle (Deletang: 5)
    cycle_length: int = 5
    #: the final state is the label at every position (the running state), not only at the last
    running: bool = False


@register_task("cycle_navigation")
class CycleNavigation(Task):
    """Walk a cycle; label: the final state (or the running state); see the module docstring."""

    Config = CycleNavigationConfig

    @property
    def vocab_size(self) -> int:
        return 3

    @property
    def num_classes(self) -> int:
        return self.config.cycle_length

    def _validate(self) -> None:
        c = self.config
        check(c.seq_len >= 1, self.name, f"seq_len must be >= 1, got {c.seq_len}")
        check(
            isinstance(c.cycle_length, int) and not isinstance(c.cycle_length, bool) and c.cycle_length >= 2,
            self.name,
            f"cycle_length must be an int >= 2, got {c.cycle_length!r}",
        )
        check(isinstance(c.running, bool), self.name, f"running must be True or False, got {c.running!r}")

    def _generate(self, num_samples: int, generator: torch.Generator) -> TaskData:
        actions = uniform_tokens(generator, (num_samples, self.seq_len), 0, 3)
        states = (actions - 1).cumsum(dim=1) % self.config.cycle_length
        if self.config.running:
            return TaskData(actions, states)
        targets = torch.full_like(actions, IGNORE_INDEX)
        targets[:, -1] = states[:, -1]
        return TaskData(actions, targets)
