"""fla's gated ``chunk_bwd_dqkwg`` in PyTorch and in our Triton, for the machines where fla's Triton one is wrong.

fla computes the backward of every gated chunk kernel (``chunk_gated_delta_rule``,
``chunk_gated_delta_product``, ``chunk_simple_gla``, ...) through one shared function,
``fla.ops.common.chunk_o.chunk_bwd_dqkwg``. On Hopper GPUs with Triton >= 3.4.0, < 3.7.1 Triton
miscompiles its gated case (fla issue #640) and fla raises instead of running it, unless tilelang is
installed. ``chunk_bwd_dqkwg`` below is the same function written with PyTorch batched matmuls (the
reference), ``chunk_bwd_dqkwg_triton`` our Triton kernel of it (``dqkwg_kernel.py``, which never
transposes a product); ``register()`` offers them to fla's backend registry (``fla.backends``, the
extension point fla's own tilelang backend uses; ``REGISTERED`` says which runs), whose verifier
accepts exactly the calls fla would refuse. Everywhere else fla's Triton kernel runs as before.

What it computes, per batch, value head and chunk of ``BT`` positions (``g`` is the cumulative log2
decay within the chunk, ``g_last`` its value at the chunk's last position, ``h``/``dh`` the state at the
chunk's start and its gradient, ``K x V``), with ``ds = tril(do v^T * 2^(g_i - g_j)) * scale``:

    dq = scale * 2^g * (do h^T) + ds k
    dk = 2^(g_last - g) * (v dh^T) + ds^T q
    dw = -(dv h^T)                                                   (delta rules only)
    dg = rowsum(dq * q) - rowsum(dk * k), plus at the last position
         2^g_last * <h, dh> + sum over the chunk of rowsum(2^(g_last - g) (v dh^T) * k)

These are the gradients of ``<do, o> + <dh, h_next> + <dv, u - w h>`` with
``o = scale (2^g q h + tril(q k^T 2^(g_i - g_j)) v)`` and
``h_next = 2^g_last h + (2^(g_last - g) k)^T v``, in q, k, w and g, with dg in units of ``ln 2``
(fla multiplies by it later). ``tests/kernels/test_fla_gated_bwd.py`` checks exactly that against
autograd in float64.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def _chunked(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """``(B, T, H, ...) -> (B, NT, H, chunk, ...)``, zero-padded to a whole number of chunks, float32."""
    B, T = x.shape[:2]
    nt = -(-T // chunk)
    pad = [0, 0] * (x.dim() - 2) + [0, nt * chunk - T]
    x = F.pad(x.float(), pad).view(B, nt, chunk, *x.shape[2:])
    return x.transpose(2, 3)


def _check_gated(form: str, g, g_gamma, cu_seqlens) -> None:
    """Both forms compute the gated case (``g`` given) of equal-length sequences only."""
    if g is None or g_gamma is not None or cu_seqlens is not None:
        raise ValueError(f"chunk_bwd_dqkwg ({form}): only the gated case (g given) of equal-length sequences")


def chunk_bwd_dqkwg(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    h: torch.Tensor,
    dh: torch.Tensor,
    w: torch.Tensor | None = None,
    g: torch.Tensor | None = None,
    g_gamma: torch.Tensor | None = None,
    dv: torch.Tensor | None = None,
    scale: float | None = None,
    state_v_first: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
    chunk_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """fla's ``chunk_bwd_dqkwg`` for a decay ``g`` and equal-length sequences, in float32.

    Shapes: q, k ``(B, T, H, K)``; v, do, dv ``(B, T, HV, V)`` (HV a multiple of H: grouped value heads);
    w ``(B, T, HV, K)``; g ``(B, T, HV)`` float32, cumulative log2 decay within each chunk; h, dh
    ``(B * NT, HV, K, V)`` (``(..., V, K)`` when ``state_v_first``), the state at each chunk's start and
    its gradient. Returns dq, dk ``(B, T, H, K)`` in q's dtype, dw like w (None without w) and dg
    ``(B, T, HV)`` float32 (in units of ln 2)."""
    _check_gated("PyTorch", g, g_gamma, cu_seqlens)
    B, T, H, K = k.shape
    HV = v.shape[2]
    groups, BT = HV // H, chunk_size
    nt = -(-T // BT)
    if scale is None:
        scale = K**-0.5

    def heads(x):  # q/k heads to value heads
        return _chunked(x.repeat_interleave(groups, dim=2) if groups > 1 else x, BT)

    q_c, k_c, v_c, do_c = heads(q), heads(k), _chunked(v, BT), _chunked(do, BT)  # (B, NT, HV, BT, K|V)
    h_c, dh_c = (x.float().view(B, nt, HV, *x.shape[-2:]) for x in (h, dh))
    if state_v_first:
        h_c, dh_c = h_c.transpose(-1, -2), dh_c.transpose(-1, -2)  # (B, NT, HV, K, V)
    g_c = _chunked(g, BT)  # (B, NT, HV, BT)

    pos = torch.arange(nt * BT, device=q.device).view(nt, 1, BT)
    valid = pos < T  # (NT, 1, BT)
    starts = torch.arange(nt, device=q.device) * BT
    last = (torch.clamp(starts + BT, max=T) - 1 - starts).view(1, nt, 1, 1)  # each chunk's last position
    g_last = g_c.gather(-1, last.expand(B, nt, HV, 1))  # (B, NT, HV, 1)

    dq = do_c @ h_c.transpose(-1, -2) * (torch.exp2(g_c) * scale).unsqueeze(-1)
    dk = v_c @ dh_c.transpose(-1, -2) * torch.where(valid, torch.exp2(g_last - g_c), 0.0).unsqueeze(-1)
    dg_last = (h_c * dh_c).sum((-1, -2)).unsqueeze(-1) * torch.exp2(g_last) + (dk * k_c).sum((-1, -2)).unsqueeze(-1)

    causal = torch.ones(BT, BT, dtype=torch.bool, device=q.device).tril() & valid.unsqueeze(-1) & valid.unsqueeze(-2)
    decay = torch.where(causal, torch.exp2(torch.where(causal, g_c.unsqueeze(-1) - g_c.unsqueeze(-2), 0.0)), 0.0)
    ds = (do_c @ v_c.transpose(-1, -2)) * decay * scale  # (B, NT, HV, BT, BT)
    dq = dq + ds @ k_c
    dk = dk + ds.transpose(-1, -2) @ q_c
    dg = (dq * q_c).sum(-1) - (dk * k_c).sum(-1)
    dg = dg.scatter_add(-1, last.expand(B, nt, HV, 1), dg_last)

    def unchunk(x):  # (B, NT, HV, BT, ...) -> (B, T, HV, ...), contiguous (fla's kernels view their inputs)
        return x.transpose(2, 3).reshape(B, nt * BT, *x.shape[2:3], *x.shape[4:])[:, :T].contiguous()

    dq, dk = unchunk(dq), unchunk(dk)
    if groups > 1:
        dq, dk = dq.view(B, T, H, groups, K).sum(3), dk.view(B, T, H, groups, K).sum(3)
    dw = None
    if w is not None:
        dw = unchunk(-(_chunked(dv, BT) @ h_c.transpose(-1, -2))).to(w.dtype)
    return dq.to(q.dtype), dk.to(q.dtype), dw, unchunk(dg)


def chunk_bwd_dqkwg_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    h: torch.Tensor,
    dh: torch.Tensor,
    w: torch.Tensor | None = None,
    g: torch.Tensor | None = None,
    g_gamma: torch.Tensor | None = None,
    dv: torch.Tensor | None = None,
    scale: float | None = None,
    state_v_first: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
    chunk_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``chunk_bwd_dqkwg`` (same arguments, shapes and results) as one Triton kernel (``dqkwg_kernel.py``):
    CUDA tensors, or the CPU under ``TRITON_INTERPRET=1``; products in the inputs' dtype."""
    from seqkernels._triton import cdiv, empty, next_pow2
    from seqkernels.delta.dqkwg_kernel import dqkwg_kernel

    _check_gated("Triton", g, g_gamma, cu_seqlens)
    if w is not None and dv is None:
        raise ValueError("chunk_bwd_dqkwg (Triton): w needs dv")
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    BT, groups = chunk_size, HV // H
    if BT < 16 or BT & (BT - 1):
        raise ValueError(f"chunk_bwd_dqkwg (Triton): chunk_size must be a power of two >= 16, got {BT}")
    # blocks of 32 value columns and 8 warps past head dim 16: the fewest register spills compiled for sm_90
    BK, BV = max(16, next_pow2(K)), min(max(16, next_pow2(V)), 32)
    f32, dev = torch.float32, q.device
    dq, dk = empty((B, T, HV, K), dev, f32), empty((B, T, HV, K), dev, f32)
    dg = empty((B, T, HV), dev, f32)
    dw = empty(tuple(w.shape), dev, w.dtype) if w is not None else None
    c = [x.contiguous() for x in (q, k, v, do, h, dh)]
    w_arg, dv_arg = (w.contiguous(), dv.contiguous()) if w is not None else (c[0], c[3])  # unread without w
    dqkwg_kernel[(cdiv(T, BT), B * HV)](
        *c, w_arg, dv_arg, g.contiguous(), dq, dk, dw if dw is not None else dq, dg, T, float(scale or K**-0.5),
        H=H, HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV, HAS_W=w is not None, STATE_V_FIRST=state_v_first,
        num_warps=4 if BK <= 16 else 8,
    )  # fmt: skip
    if groups > 1:
        dq, dk = dq.view(B, T, H, groups, K).sum(3), dk.view(B, T, H, groups, K).sum(3)
    return dq.to(q.dtype), dk.to(q.dtype), dw, dg


def triton_refuses() -> bool:
    """Whether fla's Triton ``chunk_bwd_dqkwg`` refuses its gated calls on this machine (fla's own
    condition, issue #640)."""
    from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1

    return IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1


#: what the registered backend runs: ``"triton"`` (default: the kernel where Triton runs, else the PyTorch
#: function), ``"torch"`` (the PyTorch function) (``benchmarks.ops delta`` times both: ``fla``
#: and ``fla-torch-dqkwg``)
REGISTERED = "triton"
#: the widest key head the kernel runs (it holds a chunk's whole key width in one tile; tested on a GPU
#: up to 128); wider heads take the PyTorch function
TRITON_MAX_HEAD_DIM = 128


def registered_function(q: torch.Tensor):
    """The ``chunk_bwd_dqkwg`` the registered backend runs for inputs like ``q (B, T, H, K)``
    (``REGISTERED``; the kernel for keys up to ``TRITON_MAX_HEAD_DIM`` wide where Triton runs)."""
    from seqkernels._triton import triton_available

    if REGISTERED == "triton" and triton_available(q) and q.shape[-1] <= TRITON_MAX_HEAD_DIM:
        return chunk_bwd_dqkwg_triton
    return chunk_bwd_dqkwg


@functools.cache
def register() -> None:
    """Offer ``chunk_bwd_dqkwg`` to fla's backend registry for the calls fla's Triton kernel refuses
    (after tilelang, when that is installed). Idempotent; imports fla."""
    try:
        from fla.backends import BaseBackend
        from fla.backends import register as fla_register
    except ImportError:  # an fla without the backend registry (before 0.6) has no refusal to route around
        return

    class GatedBackwardStandIn(BaseBackend):
        backend_type = "expressivity"
        priority = 10  # after fla's own backends

        def chunk_bwd_dqkwg_verifier(self, q, k, v, do, h, dh, w=None, g=None, g_gamma=None, dv=None, **kw):
            if g is None or not triton_refuses():
                return False, "fla's Triton kernel handles this call"
            if kw.get("cu_seqlens") is not None:
                return False, "variable-length sequences are not supported"
            return True, None

        def chunk_bwd_dqkwg(self, q, *args, **kwargs):  # fla passes every argument by keyword
            return registered_function(q)(q, *args, **kwargs)

    fla_register("common")(GatedBackwardStandIn)
