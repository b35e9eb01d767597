"""The delta-rule family (``seqkernels.delta``): the per-token references against independent float64
formulations with explicit dense transition matrices, the eigenvalue range of the (signed) transitions,
dispatch errors; on a GPU with flash-linear-attention, fla's kernels against the float64 reference
(forward and every input gradient) at awkward lengths.
"""

import math
import types

import pytest
import torch
import torch.nn.functional as F

from seqkernels import delta as kd

F64 = torch.float64


def _inputs(B, L, H, K, V, n=None, *, signed=True, gated=False, dtype=F64, device="cpu", seed=0):
    """Random inputs like a mixer's: unit keys, beta in [0, 2] (or [0, 1]), log decay in about (-2, 0)."""
    gen = torch.Generator().manual_seed(seed)
    lead = (B, L) if n is None else (B, L, n)
    q = torch.randn(B, L, H, K, generator=gen)
    k = F.normalize(torch.randn(*lead, H, K, generator=gen), dim=-1)
    v = torch.randn(*lead, H, V, generator=gen)
    beta = torch.sigmoid(torch.randn(*lead, H, generator=gen)) * (2 if signed else 1)
    g = -F.softplus(torch.randn(B, L, H, generator=gen)) if gated else None
    cast = lambda t: None if t is None else t.to(device=device, dtype=dtype)
    return cast(q), cast(k), cast(v), cast(beta), cast(g)


def dense_product(q, k, v, beta, g, scale):
    """Independent form: per (batch, head), token t's n steps as one affine map of the state,
    S_t = alpha_t S_{t-1} A_t + W_t with A_t = prod_j T_j, T_j = I - beta_j k_j k_j^T and
    W_t = sum_j beta_j v_j k_j^T prod_{i>j} T_i, built from explicit matrices (float64)."""
    B, L, n, H, K = k.shape
    V = v.shape[-1]
    eye = torch.eye(K, dtype=F64)
    o = torch.zeros(B, L, H, V, dtype=F64)
    for b in range(B):
        for h in range(H):
            S = torch.zeros(V, K, dtype=F64)
            for t in range(L):
                A, W = eye.clone(), torch.zeros(V, K, dtype=F64)
                for j in range(n):
                    kj, vj, bj = k[b, t, j, h].double(), v[b, t, j, h].double(), beta[b, t, j, h].double()
                    T = eye - bj * torch.outer(kj, kj)
                    A, W = A @ T, W @ T + bj * torch.outer(vj, kj)
                alpha = 1.0 if g is None else math.exp(float(g[b, t, h]))
                S = alpha * S @ A + W
                o[b, t, h] = scale * S @ q[b, t, h].double()
    return o


def dense_dplr(q, k, v, a, b, w, scale):
    """S_t = S_{t-1} (diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T with explicit matrices (float64)."""
    B, L, H, K = q.shape
    o = torch.zeros(B, L, H, v.shape[-1], dtype=F64)
    for bi in range(B):
        for h in range(H):
            S = torch.zeros(v.shape[-1], K, dtype=F64)
            for t in range(L):
                M = torch.diag(torch.exp(w[bi, t, h])) + torch.outer(a[bi, t, h], b[bi, t, h])
                S = S @ M + torch.outer(v[bi, t, h], k[bi, t, h])
                o[bi, t, h] = scale * S @ q[bi, t, h]
    return o


SIZES = [(1, 1, 1, 4, 4), (2, 13, 3, 5, 3), (1, 67, 1, 8, 8)]  # B, L, H, K, V: length 1, a prime, over 64


@pytest.mark.parametrize("B,L,H,K,V", SIZES)
@pytest.mark.parametrize("signed", [False, True])
def test_delta_rule_reference_matches_dense_matrices(B, L, H, K, V, signed):
    q, k, v, beta, _ = _inputs(B, L, H, K, V, signed=signed, seed=L)
    o = kd.delta_rule(q, k, v, beta, backend="reference")
    torch.testing.assert_close(o, dense_product(q, k[:, :, None], v[:, :, None], beta[:, :, None], None, K**-0.5))


@pytest.mark.parametrize("B,L,H,K,V", SIZES)
def test_gated_delta_rule_reference_matches_dense_matrices(B, L, H, K, V):
    q, k, v, beta, g = _inputs(B, L, H, K, V, gated=True, seed=L + 1)
    o = kd.gated_delta_rule(q, k, v, g, beta, scale=0.7, backend="reference")
    torch.testing.assert_close(o, dense_product(q, k[:, :, None], v[:, :, None], beta[:, :, None], g, 0.7))


@pytest.mark.parametrize("B,L,H,K,V", SIZES)
@pytest.mark.parametrize("n,gated", [(2, False), (3, True), (1, True)])
def test_delta_product_reference_matches_dense_matrices(B, L, H, K, V, n, gated):
    q, k, v, beta, g = _inputs(B, L, H, K, V, n, gated=gated, seed=L + n)
    o = kd.delta_product(q, k, v, beta, g, backend="reference")
    torch.testing.assert_close(o, dense_product(q, k, v, beta, g, K**-0.5))


CHUNK_SIZES = [(1, 1, 1, 4, 4), (2, 13, 3, 5, 3), (1, 67, 2, 8, 8), (2, 130, 1, 16, 6)]


@pytest.mark.parametrize("B,L,H,K,V", CHUNK_SIZES)
@pytest.mark.parametrize("n,gated", [(1, False), (1, True), (2, False), (3, True)])
@pytest.mark.parametrize("chunk", [4, 64])
def test_chunk_backend_matches_the_reference_with_gradients(B, L, H, K, V, n, gated, chunk):
    """The chunkwise (WY) form against the per-token loop in float64: output and every input gradient,
    lengths below, at and across chunk boundaries (with padding), keys not unit (qk_l2norm)."""
    from seqkernels.delta import pytorch as kc
    from seqkernels.delta import reference as kr

    q, k, v, beta, g = _inputs(B, L, H, K, V, n, gated=gated, seed=L + n + chunk)
    k = k * 2
    tensors = [t.requires_grad_() for t in (q, k, v, beta, g) if t is not None]
    o_chunk = kc.gated_delta_product(q, k, v, beta, g, qk_l2norm=True, chunk=chunk)
    o_ref = kr.gated_delta_product(q, k, v, beta, g, qk_l2norm=True)
    torch.testing.assert_close(o_chunk, o_ref, rtol=1e-10, atol=1e-10)
    do = torch.randn(o_ref.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    for a, b in zip(torch.autograd.grad(o_chunk, tensors, do), torch.autograd.grad(o_ref, tensors, do)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_chunk_backend_through_the_entry_points():
    q, k, v, beta, g = _inputs(2, 21, 3, 6, 5, gated=True, seed=7)
    for op, args in (("delta_rule", (q, k, v, beta)), ("gated_delta_rule", (q, k, v, g, beta))):
        fn = getattr(kd, op)
        torch.testing.assert_close(fn(*args, backend="chunk"), fn(*args, backend="reference"))
    q, k, v, beta, g = _inputs(2, 21, 3, 6, 5, 2, gated=True, seed=8)
    torch.testing.assert_close(
        kd.delta_product(q, k, v, beta, g, backend="chunk"), kd.delta_product(q, k, v, beta, g, backend="reference")
    )
    assert (
        kd.delta_rule(q.float(), k[:, :, 0].float(), v[:, :, 0].float(), beta[:, :, 0].float(), backend="chunk").dtype
        == torch.float32
    )


def test_product_of_one_step_is_the_delta_rule_and_zero_decay_is_ungated():
    q, k, v, beta, _ = _inputs(2, 11, 3, 6, 5, seed=3)
    plain = kd.delta_rule(q, k, v, beta, backend="reference")
    torch.testing.assert_close(kd.delta_product(q, k[:, :, None], v[:, :, None], beta[:, :, None]), plain)
    g0 = torch.zeros(2, 11, 3, dtype=F64)
    torch.testing.assert_close(kd.gated_delta_rule(q, k, v, g0, beta, backend="reference"), plain)
    # a decay < 1 changes the result
    assert not torch.allclose(kd.gated_delta_rule(q, k, v, g0 - 0.5, beta, backend="reference"), plain)


def test_qk_l2norm_is_fla_l2norm_of_q_and_k():
    q, k, v, beta, _ = _inputs(2, 9, 2, 6, 6, seed=4)
    k = k * torch.rand(2, 9, 2, 1, dtype=F64) * 3  # not unit
    want = kd.delta_rule(
        q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6),
        k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6),
        v,
        beta,
    )
    torch.testing.assert_close(kd.delta_rule(q, k, v, beta, qk_l2norm=True), want)


@pytest.mark.parametrize("B,L,H,K,V", SIZES)
def test_dplr_reference_matches_dense_matrices(B, L, H, K, V):
    gen = torch.Generator().manual_seed(L)
    q, k = torch.randn(B, L, H, K, generator=gen, dtype=F64), torch.randn(B, L, H, K, generator=gen, dtype=F64)
    v = torch.randn(B, L, H, V, generator=gen, dtype=F64)
    kk = F.normalize(torch.randn(B, L, H, K, generator=gen, dtype=F64), dim=-1)
    lr = torch.rand(B, L, H, K, generator=gen, dtype=F64)
    w = -math.exp(-0.5) * torch.rand(B, L, H, K, generator=gen, dtype=F64)
    o = kd.dplr_delta_rule(q, k, v, -kk, kk * lr, w, backend="reference")
    torch.testing.assert_close(o, dense_dplr(q, k, v, -kk, kk * lr, w, 1.0))


RWKV7_BOUND = -math.exp(-0.5)  # RWKV-7's lower bound on the log decay


def _dplr_inputs(B, L, H, K, V, seed, decay, dtype=F64):
    """RWKV-7's DPLR inputs (``a = -kk``, ``b = kk * lr``), log decays in ``[-decay, 0]``, grad-enabled."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, L, H, K, generator=gen, dtype=F64), torch.randn(B, L, H, K, generator=gen, dtype=F64)
    v = torch.randn(B, L, H, V, generator=gen, dtype=F64)
    kk = F.normalize(torch.randn(B, L, H, K, generator=gen, dtype=F64), dim=-1)
    lr = torch.rand(B, L, H, K, generator=gen, dtype=F64)
    w = -decay * torch.rand(B, L, H, K, generator=gen, dtype=F64)
    return [t.to(dtype).requires_grad_() for t in (q, k, v, -kk, kk * lr, w)]


@pytest.mark.parametrize("B,L,H,K,V", [(2, 1, 1, 4, 4), (2, 13, 3, 5, 3), (1, 67, 2, 8, 6), (1, 130, 1, 16, 16)])
@pytest.mark.parametrize(
    "lower_bound,chunk",
    [(None, None), (None, 4), (RWKV7_BOUND, None), (RWKV7_BOUND, 5), (-3.0, None)],
)
def test_dplr_chunk_backend_matches_the_reference_with_gradients(B, L, H, K, V, lower_bound, chunk):
    """The chunkwise DPLR form against the per-token loop in float64: output and every input gradient, at
    lengths below, at and across chunk boundaries, with the pairwise decays (no bound), and factored (a
    bound: RWKV-7's in chunks of 64, -3 in chunks of 13)."""
    from seqkernels.delta import pytorch as kc

    xs = _dplr_inputs(B, L, H, K, V, seed=L + K, decay=-(lower_bound or -2.0))
    o_chunk = kc.dplr_delta_rule(*xs, scale=0.7, lower_bound=lower_bound, chunk=chunk)
    o_ref = kd.dplr_delta_rule(*xs, scale=0.7, backend="reference")
    torch.testing.assert_close(o_chunk, o_ref, rtol=1e-10, atol=1e-10)
    do = torch.randn_like(o_ref)
    for got, want in zip(torch.autograd.grad(o_chunk, xs, do), torch.autograd.grad(o_ref, xs, do)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_dplr_chunk_in_float32_at_the_strongest_decay():
    """Every log decay at RWKV-7's bound over 200 steps (chunks of 64: exp(-c) up to e^38.8 in the factored
    products) and a 10x stronger decay without a bound (pairwise): float32 within 1e-5 of float64."""
    for lower_bound, decay in ((RWKV7_BOUND, -RWKV7_BOUND), (None, 6.0)):
        xs = _dplr_inputs(2, 200, 2, 16, 16, seed=3, decay=decay, dtype=torch.float32)
        with torch.no_grad():
            xs[5].fill_(-decay)
        o = kd.dplr_delta_rule(*xs, lower_bound=lower_bound, backend="chunk")
        want = kd.dplr_delta_rule(*(x.detach().double() for x in xs), backend="reference")
        assert o.dtype == torch.float32
        assert float((o.double() - want).norm() / want.norm()) < 1e-5


def test_signed_transitions_have_eigenvalues_in_minus_one_one():
    """I - beta k k^T with unit k: eigenvalues 1 (K - 1 times) and 1 - beta; beta = 2 sigmoid(.) gives
    [-1, 1] and reaches below 0, beta = sigmoid(.) stays in [0, 1]. A product of such factors is a
    contraction (spectral norm <= 1)."""
    gen = torch.Generator().manual_seed(5)
    k = F.normalize(torch.randn(500, 6, generator=gen, dtype=F64), dim=-1)
    logits = torch.randn(500, generator=gen, dtype=F64) * 4
    eye = torch.eye(6, dtype=F64)
    for scale, lo in ((2.0, -1.0), (1.0, 0.0)):
        beta = scale * torch.sigmoid(logits)
        T = eye - beta[:, None, None] * k[:, :, None] * k[:, None, :]
        eig = torch.linalg.eigvalsh(T)
        assert eig.min() >= lo - 1e-12 and eig.max() <= 1 + 1e-12
        torch.testing.assert_close(eig[:, 0], torch.minimum(1 - beta, torch.ones_like(beta)))
        assert (eig.min() < -0.9) == (scale == 2.0)
    product = T[:250] @ T[250:]
    assert torch.linalg.matrix_norm(product, ord=2).max() <= 1 + 1e-12


def test_reference_dtypes():
    q, k, v, beta, _ = _inputs(1, 5, 2, 4, 4, dtype=torch.bfloat16)
    assert kd.delta_rule(q, k, v, beta).dtype == torch.bfloat16
    q, k, v, beta, _ = _inputs(1, 5, 2, 4, 4, dtype=torch.float32)
    o32 = kd.delta_rule(q, k, v, beta)
    o64 = kd.delta_rule(*(t.double() for t in (q, k, v, beta)))
    assert o32.dtype == torch.float32
    torch.testing.assert_close(o32.double(), o64, rtol=1e-5, atol=1e-6)


def test_dispatch_errors():
    q, k, v, beta, _ = _inputs(1, 3, 2, 4, 4)
    with pytest.raises(
        ValueError,
        match="unknown delta_rule backend 'tirton'; valid: auto, reference, chunk, triton, triton_chunk, fla",
    ):
        kd.delta_rule(q, k, v, beta, backend="tirton")
    with pytest.raises(ValueError, match="unknown gated_delta_rule backend 'fla_recurrent'"):
        kd.gated_delta_rule(q, k, v, beta, beta, backend="fla_recurrent")
    with pytest.raises(ValueError, match="need CUDA tensors|needs flash-linear-attention"):
        kd.delta_rule(q, k, v, beta, backend="fla")
    with pytest.raises(ValueError, match=r"beta has shape \(1, 3\), expected \(1, 3, 2\)"):
        kd.delta_rule(q, k, v, beta[..., 0])
    with pytest.raises(TypeError, match="v must be floating point"):
        kd.delta_rule(q, k, v.long(), beta)
    assert kd.resolve_backend("delta_rule", "auto", q) == "chunk"  # CPU tensors
    assert kd.resolve_backend("dplr_delta_rule", "auto", q) == "reference"  # the pairwise chunks: slower here
    assert kd.resolve_backend("dplr_delta_rule", "auto", q, bounded=True) == "chunk"


@pytest.mark.parametrize(
    "op,gated,head_dim,steps,fla,refuses,expected",
    [
        ("delta_rule", False, 16, 128, False, False, "triton_chunk"),  # no fla: our chunked kernels
        ("delta_rule", False, 16, 4096, False, False, "triton_chunk"),
        ("delta_rule", False, 17, 128, False, False, "triton_chunk"),
        ("delta_product", True, 64, 4096, False, False, "triton_chunk"),
        ("dplr_delta_rule", False, 64, kd.AUTO_DPLR_CHUNK_MIN_STEPS - 1, False, False, "triton"),  # the recurrence
        ("dplr_delta_rule", False, 64, kd.AUTO_DPLR_CHUNK_MIN_STEPS, False, False, "triton_chunk"),  # long: chunks
        ("delta_rule", False, 16, kd.AUTO_OURS_MAX_STEPS, True, False, "triton_chunk"),  # short: ours
        ("delta_rule", False, 16, kd.AUTO_OURS_MAX_STEPS + 1, True, True, "fla"),  # ungated: fla's own kernels
        ("delta_product", False, 16, 256, True, True, "fla"),
        ("delta_product", False, 17, 8, True, False, "fla"),  # wider heads: fla at any length
        ("gated_delta_rule", True, 16, 128, True, True, "triton_chunk"),  # fla's gated backward refused here
        ("gated_delta_rule", True, 16, kd.AUTO_OURS_MAX_STEPS_SLOW_FLA, True, True, "triton_chunk"),
        ("gated_delta_rule", True, 16, kd.AUTO_OURS_MAX_STEPS_SLOW_FLA + 1, True, True, "fla"),
        ("gated_delta_rule", True, 32, 128, True, True, "fla"),  # wider heads: fla even so
        ("gated_delta_rule", True, 16, 128, True, False, "fla"),  # fla's Triton backward runs
        ("gated_delta_rule", True, 16, kd.AUTO_OURS_MAX_STEPS, True, False, "triton_chunk"),
        ("delta_product", True, 16, 256, True, True, "triton_chunk"),
        ("dplr_delta_rule", False, 16, 128, True, False, "triton"),  # ours beat fla's DPLR kernels
        ("dplr_delta_rule", False, 64, 128, True, False, "fla"),
    ],
)
def test_auto_on_cuda_picks_by_head_width_length_and_fla(
    monkeypatch, op, gated, head_dim, steps, fla, refuses, expected
):
    """``auto``'s table for CUDA tensors (a stand-in with ``is_cuda`` and a shape; no GPU needed), at the
    edges of ``AUTO_OURS_MAX_HEAD_DIM``, ``AUTO_OURS_MAX_STEPS`` and ``AUTO_OURS_MAX_STEPS_SLOW_FLA``; where fla
    refuses its gated backward, the stand-in registered for it is the PyTorch function."""
    from seqkernels.delta import fla_gated_bwd

    monkeypatch.setattr(kd, "fla_available", lambda: fla)
    monkeypatch.setattr(kd, "_fla_refuses_gated", lambda: refuses)
    monkeypatch.setattr(fla_gated_bwd, "REGISTERED", "torch")
    cuda_like = types.SimpleNamespace(is_cuda=True, shape=(2, steps, 4, head_dim))
    assert kd.resolve_backend(op, "auto", cuda_like, gated=gated, steps=steps) == expected


@pytest.mark.parametrize("op", ["gated_delta_rule", "delta_product"])
def test_auto_keeps_fla_where_our_triton_kernel_stands_in_for_its_refused_backward(monkeypatch, op):
    """fla refuses its gated backward, but with our Triton ``chunk_bwd_dqkwg`` registered in its place
    (the default) fla's gated path is fast again: narrow heads over more than ``AUTO_OURS_MAX_STEPS`` steps
    stay on fla."""
    from seqkernels.delta import fla_gated_bwd

    monkeypatch.setattr(kd, "fla_available", lambda: True)
    monkeypatch.setattr(kd, "_fla_refuses_gated", lambda: True)
    cuda_like = types.SimpleNamespace(is_cuda=True, shape=(2, 128, 4, 16))
    assert fla_gated_bwd.REGISTERED == "triton"
    assert kd.resolve_backend(op, "auto", cuda_like, gated=True, steps=128) == "fla"
    monkeypatch.setattr(fla_gated_bwd, "REGISTERED", "torch")
    assert kd.resolve_backend(op, "auto", cuda_like, gated=True, steps=128) == "triton_chunk"


# ---------------------------------------------------------------------------------------------- GPU


def needs_fla(test):
    """GPU tests: a CUDA device and flash-linear-attention importable."""
    test = pytest.mark.skipif(not kd.fla_available(), reason="needs flash-linear-attention (fla)")(test)
    test = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(test)
    return pytest.mark.gpu(test)


def rel(x, y, floor=0.0):
    """Relative norm error; the denominator at least ``floor`` (a tensor whose reference is zero or nearly
    so, e.g. a decay's gradient at length 1, is measured against the other tensors' scale)."""
    return float((x.double() - y.double()).norm() / max(float(y.double().norm()), floor, 1e-30))


def _compare(fast_fn, ref_fn, tensors, tol, seed=0):
    """``fast_fn`` on the float32 CUDA tensors against ``ref_fn`` on float64 copies: the output and the
    gradient of every tensor under a random upstream gradient; returns the relative errors."""
    fast_in = [t.detach().float().cuda().requires_grad_() for t in tensors]
    ref_in = [t.detach().double().cuda().requires_grad_() for t in tensors]
    o_fast, o_ref = fast_fn(*fast_in), ref_fn(*ref_in)
    do = torch.randn(o_ref.shape, generator=torch.Generator(device="cuda").manual_seed(seed), device="cuda", dtype=F64)
    g_fast = torch.autograd.grad(o_fast, fast_in, do.float())
    g_ref = torch.autograd.grad(o_ref, ref_in, do)
    floor = 1e-2 * max(float(b.norm()) for b in g_ref)  # a hundredth of the largest gradient's norm
    errors = {"out": rel(o_fast, o_ref), **{f"d{i}": rel(a, b, floor) for i, (a, b) in enumerate(zip(g_fast, g_ref))}}
    assert o_fast.dtype == torch.float32 and torch.isfinite(o_fast).all()
    assert all(e <= tol for e in errors.values()), errors  # a NaN error fails (max() would skip it)
    return errors


GPU_SHAPES = [(2, 1, 1, 32), (2, 67, 3, 16), (1, 130, 3, 32), (1, 130, 1, 64)]  # B, L, H, D


@pytest.mark.parametrize("B,L,H,D", GPU_SHAPES)
@pytest.mark.parametrize("l2", [True, False])
@pytest.mark.parametrize("backend,tol", [("fla", 2e-2), ("fla_recurrent", 1e-4)])
@needs_fla
def test_gpu_delta_rule(B, L, H, D, l2, backend, tol):
    """fla's chunk kernel (bfloat16, ~1e-2) and fused recurrent kernel (float32: gradients checked at 1e-4)."""
    q, k, v, beta, _ = _inputs(B, L, H, D, D, seed=L)
    if l2:
        k = k * 3
    fast = lambda *t: kd.delta_rule(*t, qk_l2norm=l2, backend=backend)
    slow = lambda *t: kd.delta_rule(*t, qk_l2norm=l2, backend="reference")
    _compare(fast, slow, [q, k, v, beta], tol)


@pytest.mark.parametrize("B,L,H,D", GPU_SHAPES)
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("backend,tol", [("fla", 2e-2), ("chunk", 1e-4)])
@needs_fla
def test_gpu_gated_delta_rule(B, L, H, D, signed, backend, tol):
    """``fla``: fla's chunk kernels, with ``fla_gated_bwd`` in the backward where fla refuses its own."""
    q, k, v, beta, g = _inputs(B, L, H, D, D, gated=True, signed=signed, seed=L + 1)
    fast = lambda *t: kd.gated_delta_rule(*t, qk_l2norm=True, backend=backend)
    slow = lambda *t: kd.gated_delta_rule(*t, qk_l2norm=True, backend="reference")
    _compare(fast, slow, [q, k, v, g, beta], tol)


@pytest.mark.parametrize("B,L,H,D", GPU_SHAPES)
@pytest.mark.parametrize(
    "n,gated,backend,tol",
    [(2, False, "fla", 2e-2), (3, True, "fla", 2e-2), (2, False, "fla_recurrent", 1e-4), (3, True, "chunk", 1e-4)],
)
@needs_fla
def test_gpu_delta_product(B, L, H, D, n, gated, backend, tol):
    q, k, v, beta, g = _inputs(B, L, H, D, D, n, gated=gated, seed=L + n)
    tensors = [q, k, v, beta] + ([g] if gated else [])
    fast = lambda *t: kd.delta_product(*t, qk_l2norm=True, backend=backend)
    slow = lambda *t: kd.delta_product(*t, qk_l2norm=True, backend="reference")
    _compare(fast, slow, tensors, tol)


@needs_fla
def test_gpu_fla_gated_backward_runs_our_stand_in_exactly_where_fla_refuses(monkeypatch):
    """fla's gated backward goes through ``fla_gated_bwd``'s registered ``chunk_bwd_dqkwg`` (our Triton
    kernel by default, else the PyTorch function) iff fla's Triton one refuses (Hopper, Triton
    3.4-3.7.0); either way ``backend="fla"`` trains; ``auto`` leaves fla only where its path is slow."""
    from seqkernels.delta import fla_gated_bwd

    calls = []
    for name in ("chunk_bwd_dqkwg", "chunk_bwd_dqkwg_triton"):
        original = getattr(fla_gated_bwd, name)
        monkeypatch.setattr(
            fla_gated_bwd, name, lambda *a, _f=original, _n=name, **kw: calls.append(_n) or _f(*a, **kw)
        )
    q, k, v, beta, g = _inputs(1, 70, 2, 16, 16, gated=True)
    args = [t.float().cuda().requires_grad_() for t in (q, k, v, g, beta)]
    kd.gated_delta_rule(*args, backend="fla").sum().backward()
    refuses = fla_gated_bwd.triton_refuses()
    assert set(calls) == ({"chunk_bwd_dqkwg_triton"} if refuses else set())
    assert all(torch.isfinite(a.grad).all() for a in args)
    # 70 steps: past AUTO_OURS_MAX_STEPS, so fla while its path is fast (our Triton stand-in registered)
    assert kd.resolve_backend("gated_delta_rule", "auto", args[0], gated=True, steps=70) == "fla"
    monkeypatch.setattr(fla_gated_bwd, "REGISTERED", "torch")
    calls.clear()
    kd.gated_delta_rule(*args, backend="fla").sum().backward()
    assert set(calls) == ({"chunk_bwd_dqkwg"} if refuses else set())
    expected = "triton_chunk" if refuses else "fla"  # auto avoids fla's PyTorch fallback
    assert kd.resolve_backend("gated_delta_rule", "auto", args[0], gated=True, steps=70) == expected


@pytest.mark.parametrize("B,L,H,D", GPU_SHAPES)
@pytest.mark.parametrize("lower_bound", [None, -math.exp(-0.5)])
@needs_fla
def test_gpu_dplr_delta_rule(B, L, H, D, lower_bound):
    """RWKV-7's use: a = -kk, b = kk * lr (kk unit per head), log decay in (-exp(-1/2), 0)."""
    gen = torch.Generator().manual_seed(L)
    r, k = torch.randn(B, L, H, D, generator=gen), torch.randn(B, L, H, D, generator=gen) * 0.3
    v = torch.randn(B, L, H, D, generator=gen)
    kk_raw, lr = torch.randn(B, L, H, D, generator=gen), torch.rand(B, L, H, D, generator=gen)
    w_logit = torch.randn(B, L, H, D, generator=gen)

    def run(backend):
        def fn(r, k, v, kk_raw, lr, w_logit):
            kk = F.normalize(kk_raw, dim=-1)
            w = -math.exp(-0.5) * torch.sigmoid(w_logit)
            return kd.dplr_delta_rule(r, k, v, -kk, kk * lr, w, lower_bound=lower_bound, backend=backend)

        return fn

    _compare(run("fla"), run("reference"), [r, k, v, kk_raw, lr, w_logit], 2e-2)
