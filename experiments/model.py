"""The single-layer model of paper 000 (App. C.2), readable top to bottom.

    tokens (B, L) -> embedding(V, d) [+ sinusoidal positions] -> RMSNorm -> sequence block
                  -> RMSNorm -> linear head(d, classes) -> logits (B, L, classes)

Sequence blocks:
- ``"mixer"`` (paper 000's †; Parity and Keep-nth): the mixer alone — no convolution, gate or norm.
- ``"full"`` (MQAR and k-hop): ``in_proj(d -> 2d)`` into ``u`` and gate ``z``; causal depthwise
  conv1d on ``u`` (kernel 4) + SiLU; the mixer on ``u``; gated RMSNorm ``norm(y) * silu(z)``;
  ``out_proj(d -> d)``; residual with a learnable per-channel scale on the input.
Mixers that are whole blocks themselves (``is_block = True``: the Transformer) are used as they are.

The head has no bias by default (``head_bias=False``): paper 000's Table 6 counts (e.g. FlashGRU
32.7k on MQAR = embedding 8,192 + block 16,192 + two RMSNorm weights 128 + head weight 8,192) have
none. ``python -m experiments.paper PRESET`` prints a preset's parameter counts next to the paper's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mixers import build_mixer
from mixers.attention import sinusoidal_positions
from mixers.conv import causal_depthwise_conv

BLOCKS = ("mixer", "full")
POSITIONAL = ("none", "sinusoidal")


@dataclasses.dataclass
class ModelConfig:
    """Everything that defines the model; ``mixer_options`` go to ``build_mixer``."""

    vocab_size: int
    num_classes: int
    mixer: str = "gru"
    mixer_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    d_model: int = 64
    block: str = "mixer"
    positional: str = "none"
    conv_kernel: int = 4
    head_bias: bool = False

    def __post_init__(self) -> None:
        if self.block not in BLOCKS:
            raise ValueError(f"block must be one of {', '.join(BLOCKS)}, got {self.block!r}")
        if self.positional not in POSITIONAL:
            raise ValueError(f"positional must be one of {', '.join(POSITIONAL)}, got {self.positional!r}")
        for name in ("vocab_size", "num_classes", "d_model", "conv_kernel"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class FullBlock(nn.Module):
    """Gated block around a mixer (paper 000 Fig. 9 without the MLP): see the module docstring."""

    stackable, trials = True, 1  # mixers.stacking

    def __init__(self, mixer: nn.Module, d_model: int, conv_kernel: int = 4) -> None:
        super().__init__()
        self.in_proj = nn.Linear(d_model, 2 * d_model, bias=False)
        self.conv = nn.Conv1d(d_model, d_model, conv_kernel, groups=d_model, padding=conv_kernel - 1)
        self.mixer = mixer
        self.norm = nn.RMSNorm(d_model)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        self.skip_scale = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u, z = self.in_proj(x).unflatten(-1, (self.trials, 2, -1)).unbind(-2)  # each trial's (u, z)
        u, z = u.flatten(-2), z.flatten(-2)
        u = F.silu(causal_depthwise_conv(self.conv, u))
        y = self.norm(self.mixer(u)) * F.silu(z)
        return self.out_proj(y) + self.skip_scale * x


class SingleLayerModel(nn.Module):
    """Embedding -> RMSNorm -> sequence block -> RMSNorm -> head. ``forward(tokens (B, L)) -> (B, L, C)``.

    ``mixers.stacking.stack_trials([model, ...])`` of ``S`` models: ``forward(tokens (S, B, L)) -> (S, B, L, C)``.
    """

    stackable, trials = True, 1

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        mixer = build_mixer(config.mixer, d, **config.mixer_options)
        self.embedding = nn.Embedding(config.vocab_size, d)
        self.norm_in = nn.RMSNorm(d)
        if getattr(mixer, "is_block", False) or config.block == "mixer":
            self.block = mixer
        else:
            self.block = FullBlock(mixer, d, config.conv_kernel)
        self.norm_out = nn.RMSNorm(d)
        self.head = nn.Linear(d, config.num_classes, bias=config.head_bias)
        self.add_positions = config.positional == "sinusoidal" and not getattr(mixer, "has_positions", False)

    @property
    def mixer(self) -> nn.Module:
        return self.block.mixer if isinstance(self.block, FullBlock) else self.block

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)  # (B, L, S * d)
        length, S = tokens.shape[-1], self.trials
        if self.add_positions:
            x = x + sinusoidal_positions(length, x.shape[-1] // S, x.device, x.dtype).repeat(1, S)
        logits = self.head(self.norm_out(self.block(self.norm_in(x))))
        return logits if S == 1 else logits.unflatten(-1, (S, -1)).permute(2, 0, 1, 3)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
