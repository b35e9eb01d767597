"""Where a trial's wall time goes: training steps, validations, test passes, set-up and the host's own work.

``PhaseTimer`` is a Lightning callback for ``run_trial(..., callbacks=[timer])``: it times each training
batch (a Lightning step: one optimizer step eagerly, a chunk of CUDA-graph replays with a graph engine),
each validation while fitting and each test pass, synchronizing the GPU at each boundary so a phase
holds the GPU work it launched. The first training batch, which holds the graph engines' warm-up steps,
capture and compilation (and eager kernels' first-call compilation), is kept apart as ``warmup_s``.
A later batch whose steps took more than ``STALL_FACTOR`` times the median batch's per step (a kernel
autotuned or compiled on a later call, a recapture) is a stall: its time beyond the median's goes to
``stall_s``, once per trial, not into the step rate; so does a first validation slower than
``STALL_FACTOR`` times the median of the later ones (kernels compiled or autotuned for the evaluation's
lengths).

The host's own work is timed where it falls: ``host`` is the time between one training batch and the
next (Lightning's loop, logging), per optimizer step; the time from the last batch before a validation to
its start and from its end to the next batch (checkpoints, the Newton mixers' Jacobian check, the early
stop) counts with that validation; ``other`` is the rest of the measured wall time, once per trial
(trainer start and tear-down).

``Phases.project(max_steps, eval_every)`` scales the measured run to a full trial of the preset: set-up,
warm-up, stalls, the test passes and ``other`` once, training steps and ``host`` per optimizer step,
validations (with their host time) per validation (``max_steps // eval_every`` of them), and gives each
phase's share of that trial's wall time.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch
from lightning.pytorch.callbacks import Callback

#: the phases of a trial's wall time, in the order reports list them
PHASES = ("setup", "warmup", "stall", "train", "host", "validation", "test", "other")
#: a training batch slower per step than this many times the median batch is a stall
STALL_FACTOR = 5.0


def split_stalls(batches: list[tuple[float, int]]) -> tuple[float, int]:
    """``(stall_s, stalls)`` of training batches ``(seconds, steps)``: the time of each batch beyond the median
    per-step time, summed over the batches slower per step than ``STALL_FACTOR`` times that median."""
    per_step = [s / n for s, n in batches if n > 0]
    if not per_step:
        return 0.0, 0
    median = statistics.median(per_step)
    slow = [(s, n) for s, n in batches if n > 0 and s / n > STALL_FACTOR * median]
    return sum(s - n * median for s, n in slow), len(slow)


def _sync(pl_module) -> float:
    if pl_module.device.type == "cuda":
        torch.cuda.synchronize(pl_module.device)
    return time.perf_counter()


class PhaseTimer(Callback):
    """Times the phases of one ``run_trial`` (see the module docstring); read ``phases(...)`` after it."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, int]] = []  #: (seconds, optimizer steps) per training batch
        self.validations: list[float] = []
        self.tests: list[float] = []
        self.host: list[float] = []  #: the time between one training batch and the next, no validation between
        self.validation_host: list[float] = []  #: the training loop's time around each validation
        self._t0 = 0.0
        self._step0 = 0
        self._last_end: float | None = None  #: when the last training batch or validation ended
        self._gap_of_validation = False  #: the next gap follows a validation

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._t0, self._step0 = _sync(pl_module), trainer.global_step
        if self._last_end is not None:
            (self.validation_host if self._gap_of_validation else self.host).append(self._t0 - self._last_end)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._last_end = _sync(pl_module)
        self.batches.append((self._last_end - self._t0, trainer.global_step - self._step0))
        self._gap_of_validation = False

    def on_validation_start(self, trainer, pl_module) -> None:
        self._t0 = _sync(pl_module)
        if self._last_end is not None and not trainer.sanity_checking:
            self.validation_host.append(self._t0 - self._last_end)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._last_end = _sync(pl_module)
            self.validations.append(self._last_end - self._t0)
            self._gap_of_validation = True

    def on_train_end(self, trainer, pl_module) -> None:
        self._last_end = None  # what follows the last batch (the trainer's tear-down) is ``other``

    def on_test_start(self, trainer, pl_module) -> None:
        self._t0 = _sync(pl_module)

    def on_test_end(self, trainer, pl_module) -> None:
        self.tests.append(_sync(pl_module) - self._t0)

    def phases(self, wall_s: float, setup_s: float) -> Phases:
        """The measured phases of a run whose whole wall time was ``wall_s`` with ``setup_s`` of set-up
        (``run_trial``'s ``setup_time_s``: data sets, model, trainer)."""
        if len(self.batches) < 2:
            raise ValueError("timing a trial's phases needs at least two training batches (more --steps)")
        (warmup_s, warmup_steps), rest = self.batches[0], self.batches[1:]
        stall_s, stalls = split_stalls(rest)
        train_s, steps = sum(s for s, _ in rest) - stall_s, sum(n for _, n in rest)
        validation_s, test_s = sum(self.validations) + sum(self.validation_host), sum(self.tests)
        host_s = sum(self.host)
        if len(self.validations) >= 2:
            typical = statistics.median(self.validations[1:])
            if self.validations[0] > STALL_FACTOR * typical:
                stall_s, stalls = stall_s + self.validations[0] - typical, stalls + 1
                validation_s -= self.validations[0] - typical
        other_s = max(0.0, wall_s - setup_s - warmup_s - stall_s - train_s - host_s - validation_s - test_s)
        return Phases(
            setup_s=setup_s,
            warmup_s=warmup_s,
            warmup_steps=warmup_steps,
            stall_s=stall_s,
            stalls=stalls,
            train_s=train_s,
            host_s=host_s,
            steps=steps,
            validation_s=validation_s,
            validations=len(self.validations),
            test_s=test_s,
            other_s=other_s,
        )


@dataclasses.dataclass(frozen=True)
class Phases:
    """Measured seconds per phase of one run: ``steps`` optimizer steps after the ``warmup_steps`` of the
    first batch (``train_s``: their time less ``stall_s``, the excess of ``stalls`` stalled batches), the
    host's time between them (``host_s``), ``validations`` validations (with the loop's time around them);
    ``other`` is what the phases leave of the wall time."""

    setup_s: float
    warmup_s: float
    warmup_steps: int
    train_s: float
    steps: int
    validation_s: float
    validations: int
    test_s: float
    other_s: float
    stall_s: float = 0.0
    stalls: int = 0
    host_s: float = 0.0

    @property
    def steps_per_s(self) -> float:
        """Training steps per second after the first batch (the step's own time: no stall, validation or host loop)."""
        return self.steps / self.train_s if self.train_s > 0 else float("nan")

    def project(self, max_steps: int, eval_every: int) -> dict[str, float]:
        """Seconds per phase (``PHASES``) of a full trial of ``max_steps`` steps validating every ``eval_every``
        (see the module docstring), and ``total``."""
        per_step = self.train_s / max(self.steps, 1)
        per_validation = self.validation_s / self.validations if self.validations else 0.0
        host_per_step = self.host_s / max(self.steps, 1)
        steps = max(max_steps - self.warmup_steps, 0)
        seconds = {
            "setup": self.setup_s,
            "warmup": self.warmup_s,
            "stall": self.stall_s,
            "train": per_step * steps,
            "host": host_per_step * steps,
            "validation": per_validation * (max_steps // eval_every),
            "test": self.test_s,
            "other": self.other_s,
        }
        return {**seconds, "total": sum(seconds.values())}

    def shares(self, max_steps: int, eval_every: int) -> dict[str, float]:
        """Each phase's share of the projected full trial's wall time (they sum to 1)."""
        seconds = self.project(max_steps, eval_every)
        return {k: seconds[k] / seconds["total"] for k in PHASES}
