"""The model of paper 000 (App. C.2), readable top to bottom, with ``layers`` sequence blocks.

    tokens (B, L) -> embedding(V, d) [+ sinusoidal positions] -> RMSNorm -> sequence block
                  [-> RMSNorm -> sequence block] x (layers - 1)
                  -> RMSNorm -> linear head(d, classes) -> logits (B, L, classes)

Sequence blocks:
- ``"mixer"`` (paper 000's †; Parity and Keep-nth): the mixer alone — no convolution, gate or norm.
- ``"full"`` (MQAR and k-hop): ``in_proj(d -> 2d)`` into ``u`` and gate ``z``; causal depthwise
  conv1d on ``u`` (kernel ``conv_kernel``, default 4) + SiLU; the mixer on ``u``; gated RMSNorm
  ``norm(y) * silu(z)``; ``out_proj(d -> d)``; residual with a learnable per-channel scale on the input.
  ``conv_kernel = 0`` leaves the convolution and its SiLU out: the mixer takes ``u`` itself (xLSTM's
  sLSTM block with ``conv1d_kernel_size: 0``).
A mixed stack, ``mixer="mlstm_exp+slstm"`` (``mixers.build.split_stack``), gives layer ``i`` the mixer
``parts[i % len(parts)]`` (xLSTM[1:1] at ``layers=2``; ``layers`` must be a multiple of the number of
parts); ``mixer_options`` go to every part (per-part options: ``name[key=value]`` in the stack).
Mixers that are whole blocks themselves (``is_block = True``: the Transformer) are used as they are.

Depth (``layers``, default 1): each block is pre-norm (an RMSNorm before it). At ``layers = 1`` the
model is exactly paper 000's single-layer model (parameter names and counts unchanged). Deeper, each
block is residual: the full block and the Transformer carry their own residual connection; a bare
mixer gets one (``x + mixer(norm(x))``), since a stack of bare mixers without it would not train.

``mlp_ratio > 0`` adds an MLP after every sequence block (``MLP``: ``x + Linear(GELU(Linear(RMSNorm(x))))``,
hidden width ``mlp_ratio * d``; paper 000 Fig. 9's block has one); the default 0 leaves it out.

The head has no bias by default (``head_bias=False``): paper 000's Table 6 counts (e.g. FlashGRU
32.7k on MQAR = embedding 8,192 + block 16,192 + two RMSNorm weights 128 + head weight 8,192) have
none. ``python -m experiments.paper PRESET`` prints a preset's parameter counts next to the paper's.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from experiments.trial.shape import ModelShape
from mixers import build_mixer
from mixers.attention import sinusoidal_positions
from mixers.build import split_stack
from mixers.conv import causal_depthwise_conv
from mixers.protocol import declared


@dataclasses.dataclass
class ModelConfig(ModelShape):
    """A ``ModelShape`` for a task's vocabulary and classes: everything that defines the model
    (``ModelShape.config`` builds one; ``mixer_options`` go to ``build_mixer``)."""

    vocab_size: int
    num_classes: int
    head_bias: bool = False

    @classmethod
    def of(cls, shape: ModelShape, vocab_size: int, num_classes: int) -> ModelConfig:
        """The model of ``shape`` for a task's ``vocab_size`` tokens and ``num_classes`` classes."""
        return cls(vocab_size, num_classes, **{**shape.to_dict(), "mixer_options": dict(shape.mixer_options)})

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("vocab_size", "num_classes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be >= 1, got {value!r}")
        parts = split_stack(self.mixer)
        if self.layers % len(parts):
            raise ValueError(
                f"layers must be a multiple of the {len(parts)} mixers of stack {self.mixer!r}, got {self.layers}"
            )


class FullBlock(nn.Module):
    """Gated block around a mixer (paper 000 Fig. 9 without the MLP): see the module docstring."""

    stackable, trials = True, 1  # mixers.stacking

    def __init__(self, mixer: nn.Module, d_model: int, conv_kernel: int = 4) -> None:
        super().__init__()
        self.in_proj = nn.Linear(d_model, 2 * d_model, bias=False)
        # conv_kernel 0: no convolution (a plain attribute, so stacking copies it as it is)
        self.conv = (
            nn.Conv1d(d_model, d_model, conv_kernel, groups=d_model, padding=conv_kernel - 1) if conv_kernel else None
        )
        self.mixer = mixer
        self.norm = nn.RMSNorm(d_model)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        self.skip_scale = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u, z = self.in_proj(x).unflatten(-1, (self.trials, 2, -1)).unbind(-2)  # each trial's (u, z)
        u, z = u.flatten(-2), z.flatten(-2)
        if self.conv is not None:
            u = F.silu(causal_depthwise_conv(self.conv, u))
        y = self.norm(self.mixer(u)) * F.silu(z)
        return self.out_proj(y) + self.skip_scale * x


class MLP(nn.Module):
    """The MLP after a sequence block (``mlp_ratio > 0``): ``x + Linear(GELU(Linear(RMSNorm(x))))``, hidden
    width ``round(ratio * d_model)``, no biases. ``(B, L, d) -> (B, L, d)``."""

    stackable, trials = True, 1

    def __init__(self, d_model: int, ratio: float) -> None:
        super().__init__()
        hidden = max(1, round(ratio * d_model))
        self.net = nn.Sequential(
            nn.RMSNorm(d_model),
            nn.Linear(d_model, hidden, bias=False),
            nn.GELU(),
            nn.Linear(hidden, d_model, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


def sequence_block(config: ModelConfig, layer: int = 0) -> nn.Module:
    """The sequence block of layer ``layer`` (from 0) of ``config``: its mixer alone, or in a ``FullBlock``."""
    parts = split_stack(config.mixer)
    mixer = build_mixer(parts[layer % len(parts)], config.d_model, **config.mixer_options)
    if declared(mixer, "is_block") or config.block == "mixer":
        return mixer
    return FullBlock(mixer, config.d_model, config.conv_kernel)


def has_own_residual(block: nn.Module) -> bool:
    """Does ``block`` add its input to its output itself (the full block, a whole-block mixer)?"""
    return isinstance(block, FullBlock) or declared(block, "is_block")


class ResidualLayer(nn.Module):
    """A deeper model's layer ``2..N``: ``x -> block(norm(x))``, plus ``x`` where the block has no residual."""

    stackable, trials = True, 1

    def __init__(self, block: nn.Module, d_model: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(d_model)
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(self.norm(x))
        return y if has_own_residual(self.block) else x + y


class SequenceModel(nn.Module):
    """Embedding -> (RMSNorm -> sequence block) x layers -> RMSNorm -> head.
    ``forward(tokens (B, L)) -> logits (B, L, C)``.

    Parameters: ``embedding``, ``norm_in``, ``block`` (the first layer), ``deeper`` (layers 2..N, a
    ``ModuleList`` of ``ResidualLayer``; absent at ``layers = 1``), ``norm_out``, ``head``, and with
    ``mlp_ratio > 0`` ``mlps`` (each layer's ``MLP``, after its block).
    ``mixers.stacking.stack_trials([model, ...])`` of ``S`` models: ``forward(tokens (S, B, L)) -> (S, B, L, C)``.
    """

    stackable, trials = True, 1

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        block = sequence_block(config)  # built first: the initialization draws as the single-layer model's did
        self.embedding = nn.Embedding(config.vocab_size, d)
        self.norm_in = nn.RMSNorm(d)
        self.block = block
        self.residual_first = config.layers > 1 and not has_own_residual(self.block)
        if config.layers > 1:
            self.deeper = nn.ModuleList(ResidualLayer(sequence_block(config, i), d) for i in range(1, config.layers))
        self.norm_out = nn.RMSNorm(d)
        self.head = nn.Linear(d, config.num_classes, bias=config.head_bias)
        self.add_positions = config.positional == "sinusoidal" and not declared(self.mixer, "has_positions")
        if config.mlp_ratio:  # built last: a model without MLPs draws its initialization as before
            self.mlps = nn.ModuleList(MLP(d, config.mlp_ratio) for _ in range(config.layers))

    def _mlp(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """``x`` through layer ``layer``'s MLP where the model has them (``mlp_ratio > 0``)."""
        return self.mlps[layer](x) if hasattr(self, "mlps") else x

    @property
    def mixer(self) -> nn.Module:
        """The first layer's mixer."""
        return self.block.mixer if isinstance(self.block, FullBlock) else self.block

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)  # (B, L, S * d)
        length, S = tokens.shape[-1], self.trials
        if self.add_positions:
            x = x + sinusoidal_positions(length, x.shape[-1] // S, x.device, x.dtype).repeat(1, S)
        y = self.block(self.norm_in(x))
        x = self._mlp(0, x + y if self.residual_first else y)
        for i, layer in enumerate(getattr(self, "deeper", ()), 1):
            x = self._mlp(i, layer(x))
        logits = self.head(self.norm_out(x))
        return logits if S == 1 else logits.unflatten(-1, (S, -1)).permute(2, 0, 1, 3)


class _Captured(Exception):
    def __init__(self, x: torch.Tensor):
        self.x = x


def mixer_input(model: SequenceModel, tokens: torch.Tensor) -> torch.Tensor:
    """What ``model.mixer`` (the first layer's mixer) receives for ``tokens (B, L)``: runs the model up to
    that mixer only, without autograd."""

    def hook(module, args):
        raise _Captured(args[0].detach())

    handle = model.mixer.register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            model(tokens)
    except _Captured as got:
        return got.x
    finally:
        handle.remove()
    raise RuntimeError("the model's forward never called its mixer")


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
