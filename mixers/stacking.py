"""Trial stacking: ``S`` models of one architecture trained as one model of ``S`` times the width.

A training step of these models is a few hundred small kernels; ``S`` trials stacked side by side
run the same kernels on ``S`` times the data, so a GPU shared by many trials does ``S`` steps of
work per launch. ``stack_trials(models)`` builds the stacked model from ``S`` built (and
initialized) models; ``trial_state_dict(stacked, s)`` gives back trial ``s``'s weights under the
original model's names, so a stacked trial's checkpoint loads into the ordinary model.

Layout: every activation of a stacked model is *wide*, ``(B, L, S * d)``, trial ``s``'s features
in ``[s * d, (s + 1) * d)``; batch row ``b`` of trial ``s`` is trial ``s``'s own sequence ``b``.
Nothing mixes features of two trials, so each trial computes exactly what its own model computes:

- ``nn.Linear`` -> ``StackedLinear`` (weights ``(S, out, in)``: a batched matmul per trial block);
  ``nn.RMSNorm`` -> ``StackedRMSNorm`` (normalizes each trial's block); ``nn.Embedding`` ->
  ``StackedEmbedding`` (tokens ``(S, B, L)``, one table per trial);
- a depthwise ``nn.Conv1d`` -> one depthwise conv over all ``S * C`` channels;
- the direct parameters of a module that declares ``stackable = True`` (per-channel or per-head
  vectors, tables of ``(..., d)``) -> concatenated along their last dimension; such a module reads
  ``self.trials`` (``S``; 1 in an ordinary model) where its forward splits the feature dimension
  (heads, projections into several parts), and runs ``S * H`` heads where it had ``H``;
- a module with a classmethod ``stack_trials(modules)`` builds its own stacked version (``CellMixer``:
  the trials' heads side by side, ``S * H`` heads);
- parameter-free activations, ``nn.Sequential`` and ``nn.ModuleList`` are stacked element by element.

Anything else raises a one-line ``ValueError`` naming the module (run that mixer one trial per model).
Trials differ in initialization and data order; everything else (architecture, options, dtype)
must be equal. Gradients stay per trial when the loss is the sum of the trials' own losses.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from mixers.protocol import declared

#: module types without parameters that compute element-wise, so a stacked copy is the module itself
_ELEMENTWISE = (nn.GELU, nn.SiLU, nn.ReLU, nn.Tanh, nn.Sigmoid, nn.Identity, nn.Dropout)


class StackedLinear(nn.Module):
    """``S`` linear maps side by side: wide ``x (..., S * in)`` -> ``(..., S * out)``; weight ``(S, out, in)``.

    One matrix product with the block-diagonal ``(S * out, S * in)`` weight: S times the FLOPs of the
    trials' own products, but no copies of the activations into trial-major order (at these widths
    the copies, not the FLOPs, cost the time)."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        super().__init__()
        first = linears[0]
        self.in_features, self.out_features = first.in_features, first.out_features
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in linears]).clone())
        self.bias = (
            nn.Parameter(torch.stack([m.bias.detach() for m in linears]).clone()) if first.bias is not None else None
        )

    @property
    def trials(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = torch.block_diag(*self.weight.unbind(0))
        return F.linear(x, weight, None if self.bias is None else self.bias.flatten())

    def trial_state(self, s: int) -> dict[str, torch.Tensor]:
        return {"weight": self.weight[s]} | ({"bias": self.bias[s]} if self.bias is not None else {})

    def extra_repr(self) -> str:
        return f"trials={self.trials}, in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class StackedRMSNorm(nn.Module):
    """``S`` RMSNorms of ``d`` channels: each trial's block of wide ``x (..., S * d)`` normalized on its own."""

    def __init__(self, norms: list[nn.RMSNorm]) -> None:
        super().__init__()
        first = norms[0]
        if len(first.normalized_shape) != 1:
            raise ValueError(
                f"stacking: an RMSNorm over {tuple(first.normalized_shape)} cannot be stacked (only over the last dim)"
            )
        self.dim, self.eps = first.normalized_shape[0], first.eps
        self.weight = (
            nn.Parameter(torch.stack([m.weight.detach() for m in norms]).clone()) if first.weight is not None else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xs = x.unflatten(-1, (-1, self.dim))
        y = F.rms_norm(xs, (self.dim,), None, self.eps)
        return (y if self.weight is None else y * self.weight).flatten(-2)

    def trial_state(self, s: int) -> dict[str, torch.Tensor]:
        return {"weight": self.weight[s]} if self.weight is not None else {}


class StackedEmbedding(nn.Module):
    """``S`` embedding tables ``(V, d)``: tokens ``(S, B, L)`` (trial ``s``'s in row ``s``) -> wide ``(B, L, S * d)``."""

    def __init__(self, embeddings: list[nn.Embedding]) -> None:
        super().__init__()
        first = embeddings[0]
        if first.padding_idx is not None or first.max_norm is not None:
            raise ValueError("stacking: embeddings with padding_idx or max_norm cannot be stacked")
        self.num_embeddings, self.embedding_dim = first.num_embeddings, first.embedding_dim
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in embeddings]).clone())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        S = self.weight.shape[0]
        if tokens.dim() != 3 or tokens.shape[0] != S:
            raise ValueError(f"a model of {S} stacked trials takes tokens (S={S}, B, L), got {tuple(tokens.shape)}")
        offsets = torch.arange(S, device=tokens.device).view(S, 1, 1) * self.num_embeddings
        x = F.embedding(tokens + offsets, self.weight.flatten(0, 1))  # (S, B, L, d)
        return x.permute(1, 2, 0, 3).flatten(-2)

    def trial_state(self, s: int) -> dict[str, torch.Tensor]:
        return {"weight": self.weight[s]}


def _stacked_conv(convs: list[nn.Conv1d]) -> nn.Conv1d:
    first = convs[0]
    C = first.in_channels
    if not (first.groups == C == first.out_channels):
        raise ValueError(f"stacking: only depthwise Conv1d can be stacked (groups == channels), got {first}")
    S = len(convs)
    conv = nn.Conv1d(
        S * C,
        S * C,
        first.kernel_size[0],
        groups=S * C,
        padding=first.padding,
        bias=first.bias is not None,
        device=first.weight.device,
        dtype=first.weight.dtype,
    )
    with torch.no_grad():
        conv.weight.copy_(torch.cat([m.weight for m in convs]))
        if conv.bias is not None:
            conv.bias.copy_(torch.cat([m.bias for m in convs]))
    conv.trials = S
    return conv


def _check_alike(modules: list[nn.Module]) -> None:
    first = modules[0]
    for m in modules[1:]:
        if type(m) is not type(first):
            raise ValueError(f"stacking: the trials' models differ ({type(first).__name__} vs {type(m).__name__})")
        shapes = {n: (p.shape, p.dtype) for n, p in first.named_parameters()}
        if shapes != {n: (p.shape, p.dtype) for n, p in m.named_parameters()}:
            raise ValueError(f"stacking: the trials' {type(first).__name__} modules have different parameters")


def stack_trials(modules: list[nn.Module]) -> nn.Module:
    """One module computing all of ``modules`` (equal architectures) side by side (module docstring).

    The stacked module holds copies of the trials' weights; ``trial_state_dict`` gives them back.
    """
    if not modules:
        raise ValueError("stacking needs at least one model")
    _check_alike(modules)
    first = modules[0]
    if isinstance(first, nn.Linear):
        return StackedLinear(modules)
    if isinstance(first, nn.RMSNorm):
        return StackedRMSNorm(modules)
    if isinstance(first, nn.Embedding):
        return StackedEmbedding(modules)
    if isinstance(first, nn.Conv1d):
        return _stacked_conv(modules)
    if declared(first, "stack_trials") is not None:
        return type(first).stack_trials(modules)
    if isinstance(first, _ELEMENTWISE):
        return copy.deepcopy(first)
    if not (declared(first, "stackable") or type(first) in (nn.Sequential, nn.ModuleList)):
        raise ValueError(
            f"{type(first).__name__} cannot be stacked (it does not declare stackable = True): "
            "train it one trial per model"
        )
    if any(True for _ in first.buffers(recurse=False)):
        raise ValueError(f"stacking: {type(first).__name__} has buffers; give it a stack_trials classmethod")
    stacked = copy.copy(first)
    stacked.__dict__ = dict(first.__dict__)
    stacked._parameters, stacked._buffers, stacked._modules = {}, {}, {}
    for name, p in first.named_parameters(recurse=False):
        stacked._parameters[name] = nn.Parameter(
            torch.cat([getattr(m, name).detach() for m in modules], dim=-1).clone(), requires_grad=p.requires_grad
        )
    for name, _ in first.named_children():
        stacked._modules[name] = stack_trials([getattr(m, name) for m in modules])
    if declared(first, "stackable"):
        stacked.trials = len(modules)
    return stacked


def trials_of(stacked: nn.Module) -> int:
    """How many trials ``stacked`` (a ``stack_trials`` result, or an ordinary model: 1) holds."""
    for m in stacked.modules():
        if isinstance(m, (StackedLinear, StackedEmbedding)):
            return m.weight.shape[0]
        if declared(m, "trials") > 1:
            return m.trials
    return 1


def trial_state_dict(stacked: nn.Module, s: int, prefix: str = "") -> dict[str, torch.Tensor]:
    """Trial ``s``'s weights in ``stacked`` under the names of the original model (detached copies)."""
    S = trials_of(stacked)
    if not 0 <= s < S:
        raise ValueError(f"trial index {s} out of range for {S} stacked trials")
    out: dict[str, torch.Tensor] = {}
    _collect(stacked, s, S, prefix, out)
    return {k: v.detach().clone() for k, v in out.items()}


def _collect(module: nn.Module, s: int, S: int, prefix: str, out: dict) -> None:
    if declared(module, "trial_state") is not None:
        out.update({prefix + k: v for k, v in module.trial_state(s).items()})
        return
    if isinstance(module, nn.Conv1d):
        out.update({prefix + n: p.chunk(S)[s] for n, p in module.named_parameters(recurse=False)})
        return
    for name, p in module.named_parameters(recurse=False):
        out[prefix + name] = p.chunk(S, dim=-1)[s]
    for name, child in module.named_children():
        _collect(child, s, S, f"{prefix}{name}.", out)
