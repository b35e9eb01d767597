"""SSD with Triton kernels, forward and backward, as ``torch.library`` custom ops.

Same function and arguments as ``chunked.ssd_chunked``. Forward: the states entering every chunk
(``chunk_state``: chunk states and the recurrence across chunks fused, the state kept on chip),
then the chunk outputs (``chunk_attn``, causal). Backward, with ``E_ts = exp(acum_t - acum_s)``, ``prev_c`` the state
entering chunk ``c`` and ``G_c`` the gradient reaching it:

- ``G_c = sum_{t in c} exp(acum_t) dy_t (x) C_t + exp(acum_last_c) G_{c+1}``, ``G_nc = dfinal``
  (``chunk_state`` in reverse)
- ``dx_s = dt_s [sum_{t>=s} (B_s.C_t) E_ts dy_t + exp(acum_last - acum_s) G_{c+1} B_s]``
- ``dB_s = dt_s [sum_{t>=s} (x_s.dy_t) E_ts C_t + exp(acum_last - acum_s) x_s G_{c+1}]``
- ``dC_t = sum_{s<=t} (dy_t.x_s) E_ts dt_s B_s + exp(acum_t) dy_t prev_c``
- ``d acum_t = dy_t.y_t - dt_t (x_t . dx_t / dt_t)`` (``dy_t.y_t = dC_t . C_t`` per head), plus ``<G_{c+1}, prev_{c+1}>`` at a chunk's last
  step; ``d(dt*A)`` is its reverse cumulative sum inside the chunk; then ``ddt``, ``dA``.

The step sizes, decays and states are float32; ``x, B, C`` are read in their dtype
(float32 / bfloat16 / float16) and the matrix products accumulate in float32 (float32 inputs use
TF32 products on GPUs that have them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

from kernels._triton import triton_available
from kernels.ssd.triton_kernels import chunk_attn_kernel, chunk_state_kernel

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _empty(*shape: int, device, dtype) -> torch.Tensor:
    """Allocation of every kernel output (tests replace it with a NaN fill to catch unwritten elements)."""
    return torch.empty(*shape, device=device, dtype=dtype)


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def _decays(dt: torch.Tensor, A: torch.Tensor, Q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``dt`` as float32 ``(batch, H, Lp)`` zero-padded, and ``acum`` its in-chunk cumsum of dt*A."""
    batch, L, H = dt.shape
    Lp = triton.cdiv(L, Q) * Q
    dtT = dt.new_zeros(batch, H, Lp, dtype=torch.float32)
    dtT[:, :, :L] = dt.transpose(1, 2)
    acum = (dtT * A.float()[:, None]).view(batch, H, Lp // Q, Q).cumsum(-1).view(batch, H, Lp)
    return dtT, acum


def _chunk_state(u, v, init, acum, dtT, Q, *, reverse, prev=None):
    """``chunk_state`` (see ``triton_kernels``): ``(batch, nc + 1, H, DU, DV)`` in ``u``'s dtype, and in
    reverse the per-``(batch, chunk, head)`` sums ``<out[c+1], prev[c+1]>`` ``(batch, nc, H)``."""
    batch, L, H, DU = u.shape
    DV = v.shape[-1]
    Lp = acum.shape[-1]
    nc = Lp // Q
    out = _empty(batch, nc + 1, H, DU, DV, device=u.device, dtype=u.dtype)
    BU, BV = min(64, _pow2(DU)), min(64, _pow2(DV))
    tiles = triton.cdiv(DU, BU) * triton.cdiv(DV, BV)
    dots = _empty(batch, nc, H, tiles, device=u.device, dtype=torch.float32) if reverse else out
    init_strides = init.stride() if init is not None else (0, 0, 0, 0)
    p = prev if prev is not None else out
    chunk_state_kernel[(batch * H, tiles)](
        u, v, init if init is not None else out, out, p, dots, acum, dtT,
        L, H, Lp, nc, DU, DV, H // v.shape[2],
        *u.stride(), *v.stride(), *init_strides, *out.stride(), *p.stride(),
        Q=Q, BS=min(Q, 64), BU=BU, BV=BV, REVERSE=reverse, HAS_INIT=init is not None,
    )
    return out, (dots.sum(-1) if reverse else None)


def _heads_per_program(ratio: int) -> int:
    """Heads summed by one program when the output is per group: a divisor of ``ratio``, <= 16."""
    return max(d for d in range(1, min(ratio, 16) + 1) if ratio % d == 0)


def _chunk_dots(q: torch.Tensor, k: torch.Tensor, Q: int) -> torch.Tensor:
    """``qk[b, c, g, t, s] = q_t . k_s`` inside each chunk, float32 ``(batch, nc, G, Q, Q)``."""
    batch, L, G, N = q.shape
    pad = (-L) % Q
    chunks = lambda t: F.pad(t.float(), (0, 0, 0, 0, 0, pad)).view(batch, -1, Q, G, N).transpose(2, 3)  # noqa: E731
    return chunks(q) @ chunks(k).transpose(-1, -2)


def _chunk_attn(q, k, v, S, acum, dtT, Q, *, reverse, out_heads, out_dtype, w=None, cb=None):
    """Run ``chunk_attn``. ``S (batch, nc, H, DK, DV)`` (any strides); ``cb (batch, nc, G, Q, Q)``
    the precomputed ``q . k`` (any strides) or ``None``. Output ``(batch, L, out_heads * splits, DV)``
    summed over heads within a split, and the row dots ``(batch, H, Lp)`` float32 when ``w`` is given."""
    batch, L = q.shape[:2]
    H, Lp = acum.shape[1], acum.shape[2]
    DK, DV = q.shape[-1], v.shape[-1]
    hpp = 1 if out_heads == H else _heads_per_program(H // out_heads)
    n_out = H // hpp
    out = _empty(batch, L, n_out, DV, device=q.device, dtype=out_dtype)
    dot = _empty(batch, H, Lp, device=q.device, dtype=torch.float32) if w is not None else acum
    # 128-row tiles only where they fit in shared memory (16-bit inputs, head dim and state <= 64)
    BT = min(Q, 128 if q.element_size() == 2 and max(DK, DV) <= 64 else 64)
    grid = (Lp // BT, batch * n_out)
    w_ = w if w is not None else v
    cb_ = cb if cb is not None else S
    chunk_attn_kernel[grid](
        q, k, v, S, w_, cb_, out, dot, acum, dtT,
        L, H, Lp, DK, DV, n_out, H // q.shape[2], H // k.shape[2], H // v.shape[2], H // w_.shape[2],
        *q.stride(), *k.stride(), *v.stride(), *S.stride(), *w_.stride(), *cb_.stride(), *out.stride(),
        Q=Q, BT=BT, BK=_pow2(DK), BV=_pow2(DV), HPP=hpp, REVERSE=reverse, HAS_DOT=w is not None, HAS_CB=cb is not None,
        num_warps=4 if max(DK, DV, BT) <= 64 else 8,
    )
    return out, (dot if w is not None else None)


@torch.library.custom_op("expressivity::ssd_fwd", mutates_args=())
def ssd_fwd(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    initial_state: torch.Tensor | None, chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``y (batch, L, H, P)`` (no ``D`` term) and the states entering every chunk and the
    final one, ``prev (batch, nc + 1, H, P, N)`` in the dtype of ``x`` (float32 inside the kernel)."""
    Q = chunk_size
    batch, L, H, P = x.shape
    dtT, acum = _decays(dt, A, Q)
    init = None if initial_state is None else initial_state.float()
    prev, _ = _chunk_state(x, B, init, acum, dtT, Q, reverse=False)
    y, _ = _chunk_attn(C, B, x, prev[:, :-1].transpose(-1, -2), acum, dtT, Q, reverse=False,
                       out_heads=H, out_dtype=x.dtype, cb=_chunk_dots(C, B, Q))
    return y, prev


@ssd_fwd.register_fake
def _(x, dt, A, B, C, initial_state, chunk_size):
    batch, L, H, P = x.shape
    nc = -(-L // chunk_size)
    return x.new_empty(x.shape), x.new_empty(batch, nc + 1, H, P, B.shape[-1])


@torch.library.custom_op("expressivity::ssd_bwd", mutates_args=())
def ssd_bwd(
    dy: torch.Tensor, dfinal: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
    B: torch.Tensor, C: torch.Tensor, prev: torch.Tensor, chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dx, ddt, dA, dB, dC, dinitial_state)`` of ``ssd_fwd`` given ``dy`` and the
    gradient ``dfinal (batch, H, P, N)`` of the final state."""
    Q = chunk_size
    batch, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    dtT, acum = _decays(dt, A, Q)
    nc = acum.shape[-1] // Q
    grads, to_end = _chunk_state(dy, C, dfinal, acum, dtT, Q, reverse=True, prev=prev)  # G_0..G_nc
    dS = grads[:, 1:]
    dx, ddt_direct = _chunk_attn(B, C, dy, dS.transpose(-1, -2), acum, dtT, Q, reverse=True,
                                 out_heads=H, out_dtype=x.dtype, w=x, cb=_chunk_dots(C, B, Q).transpose(-1, -2))
    dB, _ = _chunk_attn(x, dy, C, dS, acum, dtT, Q, reverse=True, out_heads=G, out_dtype=torch.float32)
    dC, dy_y = _chunk_attn(dy, x, B, prev[:, :-1], acum, dtT, Q, reverse=False, out_heads=G, out_dtype=torch.float32,
                           w=C)  # dy_t . y_t = dC_t(head) . C_t, in float32
    dB = dB.view(batch, L, G, -1, N).sum(3)
    dC = dC.view(batch, L, G, -1, N).sum(3)
    dacum = dy_y - dtT * ddt_direct
    dacum[:, :, Q - 1 :: Q] += to_end.transpose(1, 2)
    dda = dacum.view(batch, H, nc, Q).flip(-1).cumsum(-1).flip(-1).view(batch, H, -1)  # d(dt * A)
    ddt = ddt_direct + dda * A.float()[:, None]
    dA = (dda * dtT).sum((0, 2))
    return (dx, ddt[:, :, :L].transpose(1, 2).to(dt.dtype), dA.to(A.dtype), dB.to(B.dtype), dC.to(C.dtype),
            grads[:, 0])


@ssd_bwd.register_fake
def _(dy, dfinal, x, dt, A, B, C, prev, chunk_size):
    return (x.new_empty(x.shape), dt.new_empty(dt.shape), A.new_empty(A.shape), B.new_empty(B.shape),
            C.new_empty(C.shape), x.new_empty(dfinal.shape))


def _setup_context(ctx, inputs, output):
    x, dt, A, B, C, initial_state, chunk_size = inputs
    y, prev = output
    ctx.save_for_backward(x, dt, A, B, C, prev)
    ctx.chunk_size = chunk_size
    ctx.init_dtype = None if initial_state is None else initial_state.dtype


def _backward(ctx, dy, dprev):
    x, dt, A, B, C, prev = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(x)
    dfinal = torch.zeros_like(prev[:, -1]) if dprev is None else dprev[:, -1].to(prev.dtype)
    dx, ddt, dA, dB, dC, dinit = ssd_bwd(dy, dfinal, x, dt, A, B, C, prev, ctx.chunk_size)
    dinit = None if ctx.init_dtype is None else dinit.to(ctx.init_dtype)
    return dx, ddt, dA, dB, dC, dinit, None


ssd_fwd.register_autograd(_backward, setup_context=_setup_context)


def _check(x, dt, A, B, C, initial_state, chunk_size) -> None:
    if not triton_available(x):
        raise ValueError(f"ssd backend 'triton' needs a CUDA tensor or TRITON_INTERPRET=1, got a {x.device} tensor")
    if x.dtype not in DTYPES or B.dtype != x.dtype or C.dtype != x.dtype:
        raise TypeError(f"ssd triton: x, B, C must share one dtype of {DTYPES}, got {x.dtype}, {B.dtype}, {C.dtype}")
    if chunk_size not in (16, 32, 64, 128, 256):
        raise ValueError(f"ssd triton: chunk_size must be a power of two in [16, 256], got {chunk_size}")
    if x.shape[-1] > 256 or B.shape[-1] > 256:
        raise ValueError(f"ssd triton: head dim P={x.shape[-1]} and state N={B.shape[-1]} must be <= 256")
    if x.shape[1] == 0:
        raise ValueError("ssd triton: the sequence length must be >= 1")


def ssd_triton(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton SSD: ``(y (batch, L, H, P), final_state (batch, H, P, N))``; shapes as ``ssd_reference``."""
    _check(x, dt, A, B, C, initial_state, chunk_size)
    y, prev = ssd_fwd(x, dt, A, B, C, initial_state, chunk_size)
    return y, prev[:, -1].to(x.dtype)
