"""The fast GPU path: flash-linear-attention's Triton kernels (``fla.ops``), imported on first use.

Same signatures as ``reference.py``. Two kinds of fla kernels:

- chunked (``chunk_delta_rule``, ``chunk_gated_delta_rule``, ``chunk_gated_delta_product``,
  ``chunk_dplr_delta_rule``): forward and backward, but fla supports them in bfloat16/float16 only
  (``chunk_delta_rule`` and ``chunk_gated_delta_product`` assert ``dtype != float32``, the DPLR one
  warns). The functions below cast q, k, v, beta (and a, b, w) to bfloat16, keep the log decay ``g``
  in float32 (as fla's layers pass it), and cast the output back to the input dtype, so a float32
  model keeps float32 parameters, optimizer and loss; gradients flow back through the casts.
  The kernels accumulate in float32.
- ``fused_recurrent_delta_rule``: the time loop in one kernel, with a backward, in the input dtype
  (float32 included): ``delta_rule_recurrent`` and, as n delta steps per token on interleaved
  tokens, ``delta_product_recurrent`` (ungated only: fla's fused recurrent gated kernels have no
  backward, ``NotImplementedError``).

fla refuses the backward of its gated chunk kernels (``chunk_bwd_dqkwg`` with a decay) on Hopper GPUs
with Triton >= 3.4.0 and < 3.7.1 (wrong results, its issue #640); the gated functions below first
register ``fla_gated_bwd``'s ``chunk_bwd_dqkwg`` (our Triton kernel; the PyTorch function where Triton
cannot run) with fla's backend registry, which fla then calls exactly where it would refuse.
"""

from __future__ import annotations

import torch

from seqkernels.delta import fla_gated_bwd

_FAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _bf16(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.to(torch.bfloat16).contiguous() for x in xs]


def delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    qk_l2norm: bool = False,
) -> torch.Tensor:
    """``fla.ops.delta_rule.chunk_delta_rule`` in bfloat16."""
    from fla.ops.delta_rule import chunk_delta_rule

    o, _ = chunk_delta_rule(*_bf16(q, k, v, beta), scale=scale, use_qk_l2norm_in_kernel=qk_l2norm)
    return o.to(q.dtype)


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    qk_l2norm: bool = False,
) -> torch.Tensor:
    """``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` in bfloat16 (``g``, the log decay, in float32;
    beta and g computed outside: no in-kernel gate or sigmoid)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    fla_gated_bwd.register()

    qb, kb, vb, bb = _bf16(q, k, v, beta)
    o, _ = chunk_gated_delta_rule(
        qb, kb, vb, g.float().contiguous(), bb, scale=scale, use_qk_l2norm_in_kernel=qk_l2norm
    )
    return o.to(q.dtype)


def delta_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    qk_l2norm: bool = False,
) -> torch.Tensor:
    """``fla.ops.gated_delta_product.chunk_gated_delta_product`` in bfloat16 (``g`` float32 or None),
    the n steps of token t at interleaved positions ``t * n + j``."""
    from fla.ops.gated_delta_product import chunk_gated_delta_product

    if g is not None:
        fla_gated_bwd.register()

    B, L, n, H, K = k.shape
    qb, kb, vb, bb = _bf16(q, k.reshape(B, L * n, H, K), v.reshape(B, L * n, H, -1), beta.reshape(B, L * n, H))
    o, _ = chunk_gated_delta_product(
        qb,
        kb,
        vb,
        None if g is None else g.float().contiguous(),
        bb,
        num_householder=n,
        scale=scale,
        use_qk_l2norm_in_kernel=qk_l2norm,
    )
    return o.to(q.dtype)


def dplr_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor,
    *,
    scale: float = 1.0,
    lower_bound: float | None = None,
) -> torch.Tensor:
    """``fla.ops.generalized_delta_rule.chunk_dplr_delta_rule`` in bfloat16 (what ``chunk_rwkv7`` calls).
    ``lower_bound``: a promise that ``lower_bound <= w < 0`` (RWKV-7: -exp(-1/2)); with it the call is
    fla's RWKV-7 layer's (``safe_gate=True``, chunks of 64), without it fla's default (chunks of 16)."""
    from fla.ops.generalized_delta_rule import chunk_dplr_delta_rule

    extra = {} if lower_bound is None else {"safe_gate": True, "lower_bound": lower_bound, "chunk_size": 64}
    o, _ = chunk_dplr_delta_rule(*_bf16(q, k, v, a, b), gk=w.to(torch.bfloat16).contiguous(), scale=scale, **extra)
    return o.to(q.dtype)


def _check_fast_dtype(name: str, x: torch.Tensor) -> None:
    if x.dtype not in _FAST_DTYPES:
        raise ValueError(
            f"{name}: fla's fused_recurrent kernel takes float32/bfloat16/float16, got {x.dtype}; "
            "use backend='reference' for float64"
        )


def delta_rule_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    qk_l2norm: bool = False,
) -> torch.Tensor:
    """``fla.ops.delta_rule.fused_recurrent_delta_rule`` in the input dtype (float32 included)."""
    from fla.ops.delta_rule import fused_recurrent_delta_rule

    _check_fast_dtype("delta_rule", q)
    q, k, v, beta = (x.contiguous() for x in (q, k, v, beta.to(q.dtype)))
    o, _ = fused_recurrent_delta_rule(q, k, v, beta, scale=scale, use_qk_l2norm_in_kernel=qk_l2norm)
    return o


def delta_product_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    qk_l2norm: bool = False,
) -> torch.Tensor:
    """The ungated Householder product as ``fused_recurrent_delta_rule`` over the ``L * n`` interleaved
    steps, reading the output at each token's last step (fla's GatedDeltaProduct ``fused_recurrent`` mode)."""
    if g is not None:
        raise ValueError(
            "delta_product: backend 'fla_recurrent' has no decay (fla's fused recurrent gated kernels "
            "have no backward); use 'fla' or 'reference' with g"
        )
    B, L, n, H, K = k.shape
    if scale is None:
        scale = K**-0.5
    if qk_l2norm:  # normalize here: the zero queries of the interleaved steps must stay zero
        from seqkernels.delta.reference import l2norm

        q, k = l2norm(q), l2norm(k)
    q_steps = q.new_zeros(B, L, n, H, K)
    q_steps[:, :, -1] = q
    o = delta_rule_recurrent(
        q_steps.reshape(B, L * n, H, K),
        k.reshape(B, L * n, H, K),
        v.reshape(B, L * n, H, -1),
        beta.reshape(B, L * n, H),
        scale=scale,
    )
    return o.reshape(B, L, n, H, -1)[:, :, -1]
