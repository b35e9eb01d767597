"""The PyTorch ``chunk_bwd_dqkwg`` against autograd of the chunk function it differentiates, in float64; our
Triton kernel against it; fla's dispatch reaching the registered one.

Per chunk (``seqkernels/delta/fla_gated_bwd.py``): ``o = scale (2^g q h + tril(q k^T 2^(g_i - g_j)) v)``,
``h_next = 2^g_last h + (2^(g_last - g) k)^T v``, ``u - w h``; the scalar
``<do, o> + <dh, h_next> + <dv, -w h>`` differentiated by autograd position by position (a loop over
chunks and time steps, no batched chunk algebra) gives dq, dk, dw and ``ln 2 * dg``.
"""

import math

import pytest
import torch

from seqkernels._triton import poisoned, triton_available
from seqkernels.delta.fla_gated_bwd import chunk_bwd_dqkwg, chunk_bwd_dqkwg_triton

triton_only = pytest.mark.skipif(
    not triton_available(torch.empty(0)) and not torch.cuda.is_available(), reason="needs CUDA or TRITON_INTERPRET=1"
)


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


def _dqkwg_inputs(B, T, H, HV, K, V, chunk, seed, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    nt = -(-T // chunk)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype)

    q, k, w = rnd(B, T, H, K), rnd(B, T, H, K), rnd(B, T, HV, K)
    v, do, dv = rnd(B, T, HV, V), rnd(B, T, HV, V), rnd(B, T, HV, V)
    h, dh = rnd(B * nt, HV, K, V), rnd(B * nt, HV, K, V)
    log_decay = -torch.rand(B, T, HV, generator=gen)
    g = torch.cat([log_decay[:, t : t + chunk].cumsum(1) for t in range(0, T, chunk)], dim=1).to(device)
    return q, k, v, do, h, dh, w, g, dv


@triton_only
@pytest.mark.parametrize(
    ("B", "T", "H", "HV", "K", "V", "chunk", "v_first", "with_w"),
    [
        (1, 37, 1, 1, 16, 16, 16, False, True),  # a partial last chunk
        (2, 40, 1, 2, 20, 40, 16, True, True),  # K, V not powers of two; grouped value heads; V first
        (1, 64, 2, 2, 16, 80, 32, False, False),  # three value blocks of 32, the last partial; no w
        (1, 5, 1, 1, 16, 16, 16, False, True),  # one short chunk
    ],
)
def test_triton_kernel_equals_the_pytorch_function(B, T, H, HV, K, V, chunk, v_first, with_w):
    """``chunk_bwd_dqkwg_triton`` (the interpreter on the CPU) against ``chunk_bwd_dqkwg`` (itself checked
    against autograd above) in float32, NaN-poisoned outputs."""
    q, k, v, do, h, dh, w, g, dv = _dqkwg_inputs(B, T, H, HV, K, V, chunk, seed=T + K + V)
    if v_first:
        h, dh = h.transpose(-1, -2).contiguous(), dh.transpose(-1, -2).contiguous()
    kw = {"w": w if with_w else None, "g": g, "dv": dv if with_w else None, "scale": 0.7}
    kw.update(state_v_first=v_first, chunk_size=chunk)
    want = chunk_bwd_dqkwg(q, k, v, do, h, dh, **kw)
    with poisoned():
        got = chunk_bwd_dqkwg_triton(q, k, v, do, h, dh, **kw)
    for name, a, b in zip(("dq", "dk", "dw", "dg"), got, want, strict=True):
        if b is None:
            assert a is None, name
            continue
        assert a.shape == b.shape and a.dtype == b.dtype, name
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("T", "K", "V", "dtype", "tol"), [(130, 64, 64, torch.bfloat16, 3e-2), (300, 128, 128, torch.bfloat16, 3e-2), (67, 16, 16, torch.float32, 1e-2)])  # fmt: skip
def test_gpu_triton_kernel_equals_the_pytorch_function(T, K, V, dtype, tol):
    """Compiled on a GPU (the Hopper machines fla refuses are the ones that run it), chunks of 64: within
    the inputs' rounding of the float32 PyTorch function (relative norm error)."""
    q, k, v, do, h, dh, w, g, dv = _dqkwg_inputs(2, T, 2, 4, K, V, 64, seed=T, dtype=dtype, device="cuda")
    kw = {"w": w, "g": g, "dv": dv, "scale": K**-0.5, "chunk_size": 64}
    want = chunk_bwd_dqkwg(*(x.float() for x in (q, k, v, do, h, dh)), **{**kw, "w": w.float(), "dv": dv.float()})
    got = chunk_bwd_dqkwg_triton(q, k, v, do, h, dh, **kw)
    for name, a, b in zip(("dq", "dk", "dw", "dg"), got, want, strict=True):
        err = float((a.double() - b.double()).norm() / b.double().norm())
        assert err <= tol, (name, err)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fla_gated_backward_through_the_kernel_equals_it_through_pytorch(monkeypatch):
    """Where fla refuses its gated backward, ``REGISTERED = "triton"`` gives fla's gated delta rule the
    gradients the PyTorch function gives (within bfloat16 rounding: fla computes in bfloat16)."""
    import seqkernels.delta as kd
    from seqkernels.delta import fla_gated_bwd

    if not kd.fla_available() or not fla_gated_bwd.triton_refuses():
        pytest.skip("fla runs its own gated backward here")
    gen = torch.Generator(device="cuda").manual_seed(0)
    B, T, H, D = 2, 300, 4, 64
    q, k, v = (torch.randn(B, T, H, D, generator=gen, device="cuda") for _ in range(3))
    g = -torch.rand(B, T, H, generator=gen, device="cuda")
    beta = torch.rand(B, T, H, generator=gen, device="cuda")
    do = torch.randn(B, T, H, D, generator=gen, device="cuda")
    grads = {}
    for impl in ("torch", "triton"):
        monkeypatch.setattr(fla_gated_bwd, "REGISTERED", impl)
        xs = [x.clone().requires_grad_() for x in (q, k, v, g, beta)]
        out = kd.gated_delta_rule(*xs, qk_l2norm=True, backend="fla")
        grads[impl] = torch.autograd.grad(out, xs, do)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta"), grads["triton"], grads["torch"], strict=True):
        err = float((a.double() - b.double()).norm() / b.double().norm())
        assert err <= 2e-2, (name, err)


@pytest.mark.parametrize("registered", ["torch", "triton"])
def test_fla_dispatch_reaches_the_registered_function(monkeypatch, registered):
    """fla's own ``chunk_bwd_dqkwg`` (keyword arguments, as fla's gated chunk backward calls it), made to
    refuse as on Hopper, runs the registered function: equal to calling ours directly."""
    pytest.importorskip("fla.backends")
    from fla.ops.common.chunk_o import chunk_bwd_dqkwg as fla_chunk_bwd_dqkwg

    from seqkernels.delta import fla_gated_bwd

    if registered == "triton" and not triton_available(torch.empty(0)):
        pytest.skip("needs TRITON_INTERPRET=1 on the CPU")
    monkeypatch.setattr(fla_gated_bwd, "triton_refuses", lambda: True)
    monkeypatch.setattr(fla_gated_bwd, "REGISTERED", registered)
    fla_gated_bwd.register()
    q, k, v, do, h, dh, w, g, dv = _dqkwg_inputs(1, 37, 1, 1, 16, 16, 16, seed=3)
    kwargs = dict(q=q, k=k, v=v, w=w, g=g, h=h, dv=dv, do=do, dh=dh, scale=0.5, chunk_size=16)
    got = fla_chunk_bwd_dqkwg(**kwargs)
    want = chunk_bwd_dqkwg(**kwargs)
    for name, a, b in zip(("dq", "dk", "dw", "dg"), got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=name)


def test_the_kernel_stands_in_up_to_its_widest_key_head(monkeypatch):
    """``registered_function``: the Triton kernel for keys up to ``TRITON_MAX_HEAD_DIM`` wide where Triton runs
    (here the interpreter), the PyTorch function for wider keys, without Triton, or with ``REGISTERED = "torch"``."""
    from seqkernels.delta import fla_gated_bwd

    narrow, wide = torch.empty(1, 4, 2, fla_gated_bwd.TRITON_MAX_HEAD_DIM), torch.empty(1, 4, 2, 256)
    if triton_available(narrow):
        assert fla_gated_bwd.registered_function(narrow) is chunk_bwd_dqkwg_triton
    assert fla_gated_bwd.registered_function(wide) is chunk_bwd_dqkwg
    monkeypatch.setattr(fla_gated_bwd, "REGISTERED", "torch")
    assert fla_gated_bwd.registered_function(narrow) is chunk_bwd_dqkwg
