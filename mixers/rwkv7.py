"""RWKV-7 "Goose" time mixing (Peng et al. 2025) as a mixer: ``rwkv7``.

Follows ``fla.layers.RWKV7Attention`` (and RWKV-LM's x070 time mix) for a first layer. ``d_model``
splits into ``num_heads`` heads of ``D = d_model / num_heads``; per token ``x_t`` (``x_{-1} = 0``):

    token shift     x^c = x_t + (x_{t-1} - x_t) * mu_c              for c in r, w, k, v, a, g  (mu_c: (d,))
    receptance      r = W_r x^r,   key  k = W_k x^k,   value  v = W_v x^v
    decay           w = exp(-e^{-1/2} sigmoid(lora_w(x^w)))          in (0.545, 1), per channel
                    lora_w(x) = B_w tanh(A_w x) + b_w   (low rank)
    learning rate   a = sigmoid(lora_a(x^a))                         in (0, 1), per channel
    output gate     g = B_g sigmoid(A_g x^g)
    removal key     kk = normalize_per_head(k * k_k)                 (unit norm per head)
    key             k <- k * (1 + (a - 1) * k_a)
    state (D x D)   S_t = S_{t-1} (diag(w_t) - kk_t (a_t * kk_t)^T) + v_t k_t^T
    readout         o_t = S_t r_t
    output          y = W_o [(GroupNorm_heads(o) + (sum_D(r * k * r_k)) v) * g]   ("bonus" r_k, per head)

The recurrence is ``seqkernels.delta.dplr_delta_rule`` with ``a = -kk``, ``b = kk * a``, log decay
``log w``, scale 1 (fla's call, also its RWKV-7 promise ``log w >= -e^{-1/2}`` for its faster chunking).

Kept: token shift with six learned mixes, the low-rank decay / in-context learning rate / gate maps
(ranks as fla: 32 at the suite's sizes), kk normalization, the k update with ``k_a``, the bonus term
``r_k``, the GroupNorm over heads (eps ``D * 1e-5``) and the output gate; fla's initialization for
layer 0 of a one-layer stack (mixes, ``k_k``, ``k_a = 1.02``, ``r_k = -0.04``, decay and learning-rate
biases, orthogonal W_r, W_v and W_k (gain 0.1), low-rank maps zero-in / 0.1-orthogonal-out).
Dropped: the value residual across layers (``v_first``: a first layer has none), caches, masks.
Changed: ``W_o`` keeps PyTorch's default initialization (fla/RWKV zero it, which would make a
one-layer mixer's output identically zero at initialization).

Backends (``seqkernels.delta``): ``"reference"`` (per-token loop), ``"chunk"`` (the chunkwise PyTorch form,
any device; under the decay bound in chunks of 64 whose decays factor into matrix products), ``"triton"``
(our fused recurrent kernel, CUDA, float32 arithmetic), ``"triton_chunk"`` (the chunk form in our Triton
kernels, CUDA, float32 arithmetic), ``"fla"`` (fla's ``chunk_dplr_delta_rule`` in
bfloat16, CUDA), ``"auto"`` (``seqkernels.delta.resolve_backend``: ``"chunk"`` on a CPU).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mixers.registry import register_mixer
from mixers.validate import check_backend, positive_int
from seqkernels.delta import backends as kernel_backends
from seqkernels.delta import dplr_delta_rule

LOG_DECAY_MIN = -math.exp(-0.5)  # fla's -0.6065306597126334: log w in (LOG_DECAY_MIN, 0)


def _low_rank_dims(d_model: int, head_dim: int) -> tuple[int, int, int]:
    """fla's default ranks of the decay, learning-rate and gate maps."""
    factor = head_dim / 64
    decay = max(32, int(round(2.5 * d_model**0.5 * factor / 32) * 32))
    gate = max(32, int(round(5 * d_model**0.5 / 32) * 32))
    return decay, decay, gate


class LowRank(nn.Module):
    """``B act(A x) (+ b)``: A zero-initialized, B orthogonal times 0.1 (RWKV-7 / fla ``LoRA``)."""

    def __init__(self, d_in: int, d_out: int, rank: int, activation: nn.Module, bias: bool = True):
        super().__init__()
        self.down, self.act, self.up = nn.Linear(d_in, rank, bias=False), activation, nn.Linear(rank, d_out, bias=bias)
        with torch.no_grad():
            nn.init.zeros_(self.down.weight)
            gain = math.sqrt(rank / d_out) if rank > d_out else 1.0
            nn.init.orthogonal_(self.up.weight, gain=0.1 * gain)
            if bias:
                nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.act(self.down(x)))


class RWKV7(nn.Module):
    """RWKV-7 time mixing, ``(B, L, d_model) -> (B, L, d_model)``; equations: module docstring.

    ``num_heads`` (4, must divide ``d_model``), ``backend``. Capturable in a CUDA graph on every backend
    (fla's kernels once warmed up: ``python -m benchmarks.mixer_steps`` replays equal eager steps)."""

    graph_capturable = True

    BACKENDS = kernel_backends("dplr_delta_rule")  # auto, reference, chunk, triton, triton_chunk, fla

    def __init__(self, d_model: int, num_heads: int = 4, backend: str = "auto"):
        super().__init__()
        d, H = positive_int("d_model", d_model), positive_int("num_heads", num_heads)
        if d % H:
            raise ValueError(f"rwkv7: d_model={d} must be divisible by num_heads={H}")
        check_backend("rwkv7", backend, self.BACKENDS)
        D = d // H
        self.num_heads, self.head_dim, self.backend = H, D, backend
        n = torch.arange(d, dtype=torch.float32)
        position = n / d  # fla's ddd
        linear = n / max(d - 1, 1) - 0.5
        centred = ((n % D) - (D - 1) / 2) / max((D - 1) / 2, 1.0)
        zigzag = centred * centred.abs()
        # token-shift mixes (layer 0: exponents 0.2 / 0.9 / 0.7 as fla and RWKV-LM)
        self.mu = nn.ParameterDict(
            {
                c: nn.Parameter(1.0 - position**p)
                for c, p in (("r", 0.2), ("w", 0.9), ("k", 0.7), ("v", 0.7), ("a", 0.9), ("g", 0.2))
            }
        )
        self.k_k = nn.Parameter(0.71 - linear * 0.1)
        self.k_a = nn.Parameter(torch.full((d,), 1.02))
        self.r_k = nn.Parameter(torch.full((H, D), -0.04))
        self.r_proj, self.k_proj, self.v_proj = (nn.Linear(d, d, bias=False) for _ in range(3))
        with torch.no_grad():
            nn.init.orthogonal_(self.r_proj.weight)
            nn.init.orthogonal_(self.k_proj.weight, gain=0.1)
            nn.init.orthogonal_(self.v_proj.weight)
        rank_w, rank_a, rank_g = _low_rank_dims(d, D)
        self.w_lora = LowRank(d, d, rank_w, nn.Tanh())
        self.a_lora = LowRank(d, d, rank_a, nn.Identity())
        self.g_lora = LowRank(d, d, rank_g, nn.Sigmoid(), bias=False)
        with torch.no_grad():
            self.w_lora.up.bias.copy_(-6 + 6 * (n / max(d - 1, 1)) + 0.5 + zigzag * 2.5)
            self.a_lora.up.bias.copy_(-0.19 + zigzag * 0.3 + linear * 0.4)
        self.g_norm = nn.GroupNorm(H, d, eps=D * 1e-5)
        self.o_proj = nn.Linear(d, d, bias=False)

    def projections(self, x: torch.Tensor):
        """The recurrence's inputs for ``x (B, L, d_model)``, each ``(B, L, H, D)``: receptance ``r``, key
        ``k`` (after the ``k_a`` update), value ``v``, removal key ``kk`` (unit), in-context learning rate
        ``a``, log decay ``log_w``; and the output gate ``g (B, L, d_model)``."""
        B, L, d = x.shape
        H, D = self.num_heads, self.head_dim
        delta = F.pad(x, (0, 0, 1, 0))[:, :L] - x  # x_{t-1} - x_t, with x_{-1} = 0
        xr, xw, xk, xv, xa, xg = (x + delta * self.mu[c] for c in "rwkvag")
        r, k, v = self.r_proj(xr), self.k_proj(xk), self.v_proj(xv)
        log_w = LOG_DECAY_MIN * torch.sigmoid(self.w_lora(xw))  # log decay per channel
        a = torch.sigmoid(self.a_lora(xa))  # in-context learning rate
        g = self.g_lora(xg)
        kk = F.normalize((k * self.k_k).view(B, L, H, D), dim=-1)
        k = k * (1 + (a - 1) * self.k_a)
        r, k, v, a, log_w = (t.view(B, L, H, D) for t in (r, k, v, a, log_w))
        return r, k, v, kk, a, log_w, g

    def transitions(self, x: torch.Tensor) -> torch.Tensor:
        """The state transitions ``A_t = diag(w_t) - kk_t (a_t * kk_t)^T`` ``(B, L, H, D, D)`` of ``x (B, L,
        d_model)``: ``S_t = S_{t-1} A_t + v_t k_t^T``. In ``x``'s dtype."""
        _r, _k, _v, kk, a, log_w, _g = self.projections(x)
        return torch.diag_embed(torch.exp(log_w)) - kk[..., :, None] * (kk * a)[..., None, :]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, d = x.shape
        r, k, v, kk, a, log_w, g = self.projections(x)
        o = dplr_delta_rule(r, k, v, -kk, kk * a, log_w, scale=1.0, lower_bound=LOG_DECAY_MIN, backend=self.backend)
        o = self.g_norm(o.reshape(B * L, d)).view(B, L, d)
        bonus = ((r * k * self.r_k).sum(-1, keepdim=True) * v).reshape(B, L, d)
        return self.o_proj((o + bonus) * g)


@register_mixer("rwkv7")
def rwkv7(d_model: int, num_heads: int = 4, backend: str = "auto") -> RWKV7:
    """RWKV-7 time mixing (Peng et al. 2025, fla's RWKV7Attention as a first layer)."""
    return RWKV7(d_model, num_heads, backend)
