"""The PyTorch ``chunk_bwd_dqkwg`` against autograd of the chunk function it differentiates, in float64.

Per chunk (``seqkernels/delta/fla_gated_bwd.py``): ``o = scale (2^g q h + tril(q k^T 2^(g_i - g_j)) v)``,
``h_next = 2^g_last h + (2^(g_last - g) k)^T v``, ``u - w h``; the scalar
``<do, o> + <dh, h_next> + <dv, -w h>`` differentiated by autograd position by position (a loop over
chunks and time steps, no batched chunk algebra) gives dq, dk, dw and ``ln 2 * dg``.
"""

import math

import pytest
import torch

from seqkernels.delta.fla_gated_bwd import chunk_bwd_dqkwg


def _autograd_reference(q, k, v, do, h, dh, w, g, dv, scale, chunk):
    """dq, dk, dw, dg by autograd of the per-chunk scalar; h, dh ``(B, NT, HV, K, V)``."""
    B, T, H, K = q.shape
    HV = v.shape[2]
    q, k, w, g = (x.detach().clone().requires_grad_(True) for x in (q, k, w, g))
    total = q.new_zeros(())
    for b in range(B):
        for hv in range(HV):
            hq = hv // (HV // H)
            for c, t0 in enumerate(range(0, T, chunk)):
                t1 = min(t0 + chunk, T)
                S, dS = h[b, c, hv], dh[b, c, hv]
                g_last = g[b, t1 - 1, hv]
                h_next = torch.exp2(g_last) * S
                for i in range(t0, t1):
                    o_i = torch.exp2(g[b, i, hv]) * (q[b, i, hq] @ S)
                    for j in range(t0, i + 1):
                        o_i = o_i + torch.exp2(g[b, i, hv] - g[b, j, hv]) * (q[b, i, hq] @ k[b, j, hq]) * v[b, j, hv]
                    total = total + scale * (o_i @ do[b, i, hv])
                    h_next = h_next + torch.exp2(g_last - g[b, i, hv]) * torch.outer(k[b, i, hq], v[b, i, hv])
                    total = total + (-(w[b, i, hv] @ S)) @ dv[b, i, hv]
                total = total + (h_next * dS).sum()
    dq, dk, dw, dg = torch.autograd.grad(total, (q, k, w, g))
    return dq, dk, dw, dg / math.log(2.0)


@pytest.mark.parametrize(
    ("B", "T", "H", "HV", "K", "V", "chunk", "v_first"),
    [
        (1, 7, 1, 1, 3, 5, 4, False),
        (2, 9, 1, 3, 4, 2, 4, True),
        (1, 8, 2, 2, 5, 3, 8, False),
        (1, 1, 1, 1, 2, 2, 4, False),
    ],
)
def test_matches_autograd(B, T, H, HV, K, V, chunk, v_first):
    gen = torch.Generator().manual_seed(T * 31 + HV)
    nt = -(-T // chunk)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k, w = rnd(B, T, H, K), rnd(B, T, H, K), rnd(B, T, HV, K)
    v, do, dv = rnd(B, T, HV, V), rnd(B, T, HV, V), rnd(B, T, HV, V)
    h, dh = rnd(B, nt, HV, K, V), rnd(B, nt, HV, K, V)
    log_decay = -torch.rand(B, T, HV, generator=gen, dtype=torch.float64)  # within-chunk cumulative sums
    g = torch.cat([log_decay[:, t : t + chunk].cumsum(1) for t in range(0, T, chunk)], dim=1)
    scale = 0.7

    want = _autograd_reference(q, k, v, do, h, dh, w, g, dv, scale, chunk)
    h_in, dh_in = (x.transpose(-1, -2).contiguous() if v_first else x for x in (h, dh))
    got = chunk_bwd_dqkwg(
        q,
        k,
        v,
        do,
        h_in.reshape(B * nt, HV, *h_in.shape[-2:]),
        dh_in.reshape(B * nt, HV, *h_in.shape[-2:]),
        w=w,
        g=g,
        dv=dv,
        scale=scale,
        state_v_first=v_first,
        chunk_size=chunk,
    )
    for name, a, b in zip(("dq", "dk", "dw", "dg"), got, want, strict=True):
        assert a.shape == b.shape and a.is_contiguous(), name
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5, msg=name)


def test_refuses_what_it_does_not_compute():
    x = torch.zeros(1, 4, 1, 2)
    with pytest.raises(ValueError, match="gated case"):
        chunk_bwd_dqkwg(x, x, x, x, torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
