"""The mixer protocol: what the suite reads from a mixer module besides ``forward``.

A mixer is an ``nn.Module`` mapping ``x (B, L, d_model)`` to ``(B, L, d_model)`` causally. It may also
declare the optional attributes of ``ATTRIBUTES`` (class attributes, unless noted); a module that does
not declare one has its ``default``. Code that reads one calls ``declared(module, name)``, so the
default lives here once. Each entry names its readers; ``mixers/CONVENTIONS.md`` shows the table.
The Newton mixers' run-time state that the graph engines read (``jacobian_check_every``,
``graph_counts``, ``last_newton_stats``, ...) is ``CellMixer``'s own interface (``docs/cells.md``).
"""

from __future__ import annotations

import dataclasses

from torch import nn


@dataclasses.dataclass(frozen=True)
class Attribute:
    """One optional attribute: its ``name``, the ``default`` of a module that does not declare it,
    what it means, and who reads it."""

    name: str
    default: object
    meaning: str
    read_by: str


ATTRIBUTES: dict[str, Attribute] = {
    a.name: a
    for a in (
        Attribute(
            "is_block",
            False,
            "the mixer is a whole sequence block with its own residual (the Transformer: attention + MLP); "
            "the model uses it as it is, never inside the full gated block",
            "experiments.trial.model.sequence_block, has_own_residual",
        ),
        Attribute(
            "has_positions",
            False,
            "the mixer encodes positions itself; the model adds no sinusoidal positions",
            "experiments.trial.model (SequenceModel.add_positions)",
        ),
        Attribute(
            "BACKENDS",
            (),
            "the backend names the constructor's backend= accepts",
            "mixers.validate.check_backend, tests",
        ),
        Attribute(
            "stackable",
            False,
            "trial stacking may stack the mixer generically (its Linear / RMSNorm / depthwise Conv1d per "
            "trial, its direct parameters concatenated); declare with trials = 1",
            "mixers.stacking.stack_trials",
        ),
        Attribute(
            "trials",
            1,
            "trials a stacked module holds (set by mixers.stacking); the forward splits features by it",
            "mixers.stacking.trials_of, the stackable mixers' forward",
        ),
        Attribute(
            "stack_trials",
            None,
            "classmethod stack_trials(mixers) -> one module: the stack of a mixer with its own stacked layout "
            "(CellMixer: the trials' cells as S*H heads)",
            "mixers.stacking.stack_trials",
        ),
        Attribute(
            "trial_state",
            None,
            "method trial_state(s) -> {name: tensor}: trial s's weights of a module with its own stacked "
            "layout, under the names of the original model",
            "mixers.stacking.trial_state_dict",
        ),
        Attribute(
            "requires_cuda",
            False,
            "the mixer runs only on a CUDA GPU (fla's Triton layers); the sweep refuses it up front elsewhere",
            "experiments.sweeps.runner (the up-front model check)",
        ),
        Attribute(
            "graph_capturable",
            True,
            "False: the mixer's kernels cannot be captured in a CUDA graph; a graph engine falls back to eager",
            "experiments.trial.train.capturable_engine",
        ),
        Attribute(
            "graph_note",
            "",
            "why the mixer is not capturable (shown in the trial's engine note)",
            "experiments.trial.train.capturable_engine",
        ),
        Attribute(
            "transitions",
            None,
            "method transitions(x) -> A (B, L, H, D, D): the per-token state maps of a linear recurrence "
            "S_t = S_{t-1} A_t + (writes) on its input x (B, L, d_model) (DeltaRuleMixer, RWKV7)",
            "analysis.transitions",
        ),
    )
}


def declared(module: nn.Module, name: str):
    """``module``'s value of the protocol attribute ``name``, or the attribute's default."""
    try:
        default = ATTRIBUTES[name].default
    except KeyError:
        raise ValueError(f"{name!r} is not a mixer protocol attribute; known: {', '.join(ATTRIBUTES)}") from None
    return getattr(module, name, default)
