"""The model's shape: everything that defines a trial's model besides the task's vocabulary and classes.

    shape = ModelShape(mixer="gru", block="full", d_model=64, layers=2)
    config = ModelConfig.of(shape, vocab_size=10, num_classes=10)    # experiments.trial.model

One object, nested in ``TrialSpec`` (``spec.model``) and in a preset's ``SweepPlan`` (``plan.model``: the
shape every cell of the sweep shares; the grid sets ``mixer``, ``mixer_options`` and ``layers`` per cell).
From its fields come: the preset keys that set them (``experiments.sweeps.presets``), the flat keys of
``spec.json`` and of the study's trials (``TrialSpec.to_dict``), the cell's hash (``identity``), the results
columns (``experiments.sweeps.results``), the up-front check's set of distinct models
(``experiments.sweeps.runner.validate_specs``) and the ``ModelConfig`` that builds the model
(``ModelConfig.of``: training and ``experiments.paper`` build their models through it). A new model
option is a field here and its use in ``experiments.trial.model``.

Import-light on purpose (no torch): the results and preset modules read it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: sequence blocks: the mixer alone, or the gated full block around it (``experiments.trial.model``)
BLOCKS = ("mixer", "full")
#: positional encodings added to the embedding
POSITIONAL = ("none", "sinusoidal")
#: Lightning precision settings a trial can train with (the first is the default)
PRECISIONS = ("32-true", "bf16-mixed")
#: the fields every cell's hash covers; the others enter it only when they differ from their defaults,
#: so cells written before a field existed keep their ids
HASHED_ALWAYS = ("mixer", "mixer_options", "block", "positional")


def _check_int(name: str, value: object, least: int, note: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}{note}, got {value!r}")


@dataclasses.dataclass(kw_only=True)
class ModelShape:
    """What defines a trial's model (see the module docstring); every field has its default."""

    #: the mixer's registered name (``mixers``), or a mixed stack ``a+b`` (layer ``i``: part ``i % parts``)
    mixer: str = "gru"
    #: keyword options of the mixer's factory (every part of a stack)
    mixer_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: ``mixer`` (the mixer alone) or ``full`` (the gated block around it)
    block: str = "mixer"
    #: ``none`` or ``sinusoidal`` positions added to the embedding
    positional: str = "none"
    #: sequence blocks, each pre-norm and residual (1: paper 000's single-layer model)
    layers: int = 1
    #: the model's width (embedding and mixer channels)
    d_model: int = 64
    #: the full block's causal convolution kernel (0: none)
    conv_kernel: int = 4
    #: Lightning's precision: ``32-true`` (float32) or ``bf16-mixed`` (float32 weights, optimizer and loss;
    #: the forward under ``torch.autocast(bfloat16)``)
    precision: str = PRECISIONS[0]
    #: an MLP after every sequence block, ``x + Linear(GELU(Linear(RMSNorm(x))))`` of hidden width
    #: ``mlp_ratio * d_model`` (paper 000 Fig. 9's; 0: none)
    mlp_ratio: float = 0

    def __post_init__(self) -> None:
        if not isinstance(self.mixer, str) or not self.mixer:
            raise ValueError(f"mixer must be a mixer's name, got {self.mixer!r}")
        if self.block not in BLOCKS:
            raise ValueError(f"block must be one of {', '.join(BLOCKS)}, got {self.block!r}")
        if self.positional not in POSITIONAL:
            raise ValueError(f"positional must be one of {', '.join(POSITIONAL)}, got {self.positional!r}")
        _check_int("layers", self.layers, 1)
        _check_int("d_model", self.d_model, 1)
        _check_int("conv_kernel", self.conv_kernel, 0, " (0: no convolution)")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if isinstance(self.mlp_ratio, bool) or not isinstance(self.mlp_ratio, (int, float)) or self.mlp_ratio < 0:
            raise ValueError(f"mlp_ratio must be a number >= 0 (0: no MLP), got {self.mlp_ratio!r}")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(ModelShape))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every field's default value."""
        return ModelShape().to_dict()

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ModelShape.field_names()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelShape:
        """The shape of the fields of ``d`` (a flat spec dict: other keys are ignored; absent fields:
        their defaults)."""
        return ModelShape(**{name: d[name] for name in cls.field_names() if name in d})

    def identity(self) -> dict[str, Any]:
        """``to_dict()`` without the fields outside ``HASHED_ALWAYS`` that are at their defaults: what a
        cell's hash covers."""
        defaults = ModelShape.defaults()
        return {k: v for k, v in self.to_dict().items() if k in HASHED_ALWAYS or v != defaults[k]}
