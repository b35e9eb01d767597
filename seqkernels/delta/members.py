"""The delta rule, the gated delta rule and DeltaProduct as the one Householder-product function a fast
path implements, ``gated_delta_product(q, k, v, beta, g=None, *, scale=None, qk_l2norm=False, **options)``
with ``n = k.shape[2]`` delta steps per token: the delta rules are its ``n = 1`` cases. ``members``
gives a backend's three functions with ``reference.py``'s signatures (``options``, e.g. ``tiles=``, pass
through); ``kernel_dtype`` and ``grads_in_input_dtypes`` are the Triton paths' dtype conventions."""

from __future__ import annotations

from collections.abc import Callable

import torch

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def members(gated_delta_product: Callable[..., torch.Tensor]) -> tuple[Callable, Callable, Callable]:
    """``(delta_rule, gated_delta_rule, delta_product)`` of a backend from its ``gated_delta_product``."""

    def delta_rule(q, k, v, beta, *, scale=None, qk_l2norm=False, **options):
        """``S_t = S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = scale S_t q_t``; shapes as
        ``reference.delta_rule``."""
        one = (k[:, :, None], v[:, :, None], beta[:, :, None])
        return gated_delta_product(q, *one, None, scale=scale, qk_l2norm=qk_l2norm, **options)

    def gated_delta_rule(q, k, v, g, beta, *, scale=None, qk_l2norm=False, **options):
        """``S_t = exp(g_t) S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T``; shapes as
        ``reference.gated_delta_rule``."""
        one = (k[:, :, None], v[:, :, None], beta[:, :, None])
        return gated_delta_product(q, *one, g, scale=scale, qk_l2norm=qk_l2norm, **options)

    def delta_product(q, k, v, beta, g=None, *, scale=None, qk_l2norm=False, **options):
        """DeltaProduct: ``n`` delta steps per token, optional decay; shapes as ``reference.delta_product``."""
        return gated_delta_product(q, k, v, beta, g, scale=scale, qk_l2norm=qk_l2norm, **options)

    return delta_rule, gated_delta_rule, delta_product


def kernel_dtype(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Tensors in a dtype the Triton kernels read (``KERNEL_DTYPES``) as they are, others (float64) as
    float32."""
    return tuple(x if x.dtype in KERNEL_DTYPES else x.float() for x in xs)


def grads_in_input_dtypes(grads, inputs) -> tuple[torch.Tensor | None, ...]:
    """Each (float32) gradient in its input's dtype; ``None`` for an absent input."""
    return tuple(None if x is None else d.to(x.dtype) for d, x in zip(grads, inputs))
