"""Mamba2 (SSD) and Mamba (S6) mixers: input-dependent linear recurrences.

Both are the *mixer only* (paper 000's †: no convolution, gate or norm; the model's full block adds
those around the mixer) and have no output projection: ``(B, L, d_model) -> (B, L, d_model)``.

``mamba2`` -- the SSD layer (``seqkernels.ssd``). ``d_model`` channels split into ``num_heads`` heads
of ``P = d_model / num_heads``; per head a scalar decay ``exp(dt_t A)``, ``A = -exp(A_log) < 0``,
``dt_t = softplus(proj_t + dt_bias)``, input-dependent ``B_t, C_t`` of size ``d_state`` shared by
the heads of a group (``ngroups``), a skip ``D`` per head. One linear map (no bias) gives
``x, B, C, dt`` from the input; ``x_proj=False`` uses the input itself as ``x`` (inside the full
block, where the block's own input projection and convolution already produce it, as in Mamba2).
``conv_kernel=k`` (default 0: none) adds Mamba2's causal depthwise convolution (with bias) + SiLU
on the projected ``x, B, C`` (``B, C`` only with ``x_proj=False``: the full block convolves ``x``);
``norm=True`` adds Mamba2's RMSNorm on the output (without its gate, which the full block has).
With ``x_proj=False, conv_kernel=4`` the full block around this mixer has the Mamba2 layer's
parameters (in_proj 16,640, conv 960 at d = 64, N = 64) plus the block's per-channel skip scale.
Initialization as Mamba2: ``A`` uniform in [1, 16], ``dt`` log-uniform in [1e-3, 1e-1] through
``dt_bias`` (inverse softplus), ``D = 1``.

``mamba`` -- S6, the selective scan written as paper 003 does: expand ``x`` with ``B`` into
``d_inner x d_state`` lanes, run the diagonal linear recurrence ``seqkernels.scan.linear_scan`` over
them with coefficients ``exp(dt A)``, contract with ``C``; ``A = -exp(A_log)`` per (channel, state)
with the S4D-real init ``A = 1..N``; ``dt`` per channel. ``d_inner = expand * d_model`` must equal
``d_model`` unless an output projection is wanted, so ``expand > 1`` adds ``out_proj``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mixers.conv import causal_depthwise_conv
from mixers.registry import register_mixer
from mixers.validate import check_backend, non_negative_int, positive_int
from seqkernels.scan import SCAN_BACKENDS, linear_scan
from seqkernels.ssd import SSD_BACKENDS, resolve_backend, ssd


def _dt_bias(n: int, dt_min: float, dt_max: float) -> torch.Tensor:
    """Inverse softplus of step sizes log-uniform in ``[dt_min, dt_max]`` (Mamba's dt init)."""
    if not 0 < dt_min <= dt_max:
        raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
    dt = torch.exp(torch.rand(n) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    return dt + torch.log(-torch.expm1(-dt))


class Mamba2(nn.Module):
    """SSD mixer; see the module docstring. ``backend``: one of ``BACKENDS``."""

    BACKENDS = ("auto", *SSD_BACKENDS)
    #: ``mixers.stacking``: stacked trials run as ``trials * num_heads`` heads and ``trials * ngroups`` groups
    stackable, trials = True, 1

    def __init__(
        self,
        d_model: int,
        num_heads: int = 4,
        d_state: int = 64,
        ngroups: int = 1,
        backend: str = "auto",
        chunk_size: int = 64,
        x_proj: bool = True,
        conv_kernel: int = 0,
        norm: bool = False,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
    ):
        super().__init__()
        d_model, num_heads = positive_int("d_model", d_model), positive_int("num_heads", num_heads)
        d_state, ngroups = positive_int("d_state", d_state), positive_int("ngroups", ngroups)
        self.chunk_size = positive_int("chunk_size", chunk_size)
        non_negative_int("mamba2: conv_kernel", conv_kernel, " (0: no convolution)")
        if d_model % num_heads:
            raise ValueError(f"mamba2: d_model={d_model} must be divisible by num_heads={num_heads}")
        if num_heads % ngroups:
            raise ValueError(f"mamba2: num_heads={num_heads} must be divisible by ngroups={ngroups}")
        check_backend("mamba2", backend, self.BACKENDS)
        self.backend, self.x_proj = backend, bool(x_proj)
        self.num_heads, self.d_state, self.ngroups = num_heads, d_state, ngroups
        self.split = [d_model if self.x_proj else 0, ngroups * d_state, ngroups * d_state, num_heads]
        self.in_proj = nn.Linear(d_model, sum(self.split), bias=False)
        self.A_log = nn.Parameter(torch.log(torch.empty(num_heads).uniform_(1, 16)))
        self.dt_bias = nn.Parameter(_dt_bias(num_heads, dt_min, dt_max))
        self.D = nn.Parameter(torch.ones(num_heads))
        conv_width = sum(self.split[:3])  # x (if projected here), B, C
        self.conv = (
            nn.Conv1d(conv_width, conv_width, conv_kernel, groups=conv_width, padding=conv_kernel - 1)
            if conv_kernel
            else None
        )
        self.norm = nn.RMSNorm(d_model) if norm else None

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        batch, L, d = u.shape
        S, heads, groups = self.trials, self.trials * self.num_heads, self.trials * self.ngroups
        proj = self.in_proj(u).unflatten(-1, (S, -1))  # each trial's (x, B, C, dt)
        xbc, dt = torch.split(proj, [sum(self.split[:3]), self.split[3]], dim=-1)
        if self.conv is not None:  # causal depthwise conv + SiLU, as Mamba2's on (x, B, C)
            xbc = F.silu(causal_depthwise_conv(self.conv, xbc.flatten(-2))).unflatten(-1, (S, -1))
        x, B, C = torch.split(xbc, self.split[:3], dim=-1)
        x = x if self.x_proj else u
        y = ssd(
            x.reshape(batch, L, heads, d // heads),
            F.softplus(dt.flatten(-2) + self.dt_bias),
            -torch.exp(self.A_log),
            B.reshape(batch, L, groups, self.d_state),
            C.reshape(batch, L, groups, self.d_state),
            D=self.D,
            chunk_size=self.chunk_size,
            backend=resolve_backend(self.backend, u),
        )
        y = y.reshape(batch, L, d)
        return y if self.norm is None else self.norm(y)


class Mamba(nn.Module):
    """S6 mixer through ``seqkernels.scan.linear_scan``; see the module docstring.

    ``backend``: ``"reference"`` (a step loop over the recurrence), ``"torch"`` / ``"triton"`` (that
    backend of ``linear_scan``), ``"auto"`` (``linear_scan``'s own choice: ``seqkernels.scan.resolve_backend``).
    """

    BACKENDS = ("auto", "reference", "torch", "triton")

    def __init__(
        self,
        d_model: int,
        d_state: int = 16,
        expand: int = 1,
        backend: str = "auto",
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
    ):
        super().__init__()
        d_model, d_state = positive_int("d_model", d_model), positive_int("d_state", d_state)
        expand = positive_int("expand", expand)
        check_backend("mamba", backend, self.BACKENDS)
        self.backend, self.d_state, self.d_inner = backend, d_state, expand * d_model
        self.split = [self.d_inner, d_state, d_state, self.d_inner]  # x, B, C, dt
        self.in_proj = nn.Linear(d_model, sum(self.split), bias=False)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(self.d_inner, 1))
        self.dt_bias = nn.Parameter(_dt_bias(self.d_inner, dt_min, dt_max))
        self.D = nn.Parameter(torch.ones(self.d_inner))
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False) if expand > 1 else None

    def _scan_backend(self, u: torch.Tensor) -> str:
        if self.backend != "auto":
            if self.backend not in ("reference",) and self.backend not in SCAN_BACKENDS:
                raise ValueError(
                    f"mamba: the scan has no {self.backend!r} backend yet (has: {', '.join(SCAN_BACKENDS)})"
                )
            return self.backend
        return "auto"  # seqkernels.scan decides (seqkernels.scan.resolve_backend)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        batch, L, _ = u.shape
        x, B, C, dt = torch.split(self.in_proj(u), self.split, dim=-1)
        dt = F.softplus(dt + self.dt_bias)  # (batch, L, D)
        A = -torch.exp(self.A_log)  # (D, N)
        coeff = torch.exp(dt[..., None] * A)  # (batch, L, D, N)
        inputs = (dt * x)[..., None] * B[:, :, None, :]  # expand x with B
        backend = self._scan_backend(u)
        if backend == "reference":
            h = torch.zeros_like(inputs[:, 0])
            states = []
            for t in range(L):
                h = coeff[:, t] * h + inputs[:, t]
                states.append(h)
            h = torch.stack(states, dim=1)
        else:
            lanes = self.d_inner * self.d_state
            h = linear_scan(coeff.reshape(batch, L, lanes), inputs.reshape(batch, L, lanes), backend=backend)
            h = h.reshape(batch, L, self.d_inner, self.d_state)
        y = torch.einsum("bldn,bln->bld", h, C) + self.D * x  # contract with C, skip
        return y if self.out_proj is None else self.out_proj(y)


@register_mixer("mamba2")
def mamba2(d_model: int, **config) -> Mamba2:
    """Mamba2 SSD mixer (d_state 64, 4 heads by default)."""
    return Mamba2(d_model, **config)


@register_mixer("mamba")
def mamba(d_model: int, num_heads: int | None = None, **config) -> Mamba:
    """Mamba S6 mixer (d_state 16). ``num_heads`` is accepted for a uniform sweep config and unused:
    S6 has a decay per channel and state, not per head."""
    return Mamba(d_model, **config)
