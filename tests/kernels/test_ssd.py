"""seqkernels.ssd: every backend against an independent float64 step loop, forward and all gradients."""

import pytest
import torch

from seqkernels.ssd import SSD_BACKENDS, ssd


def _loop(x, dt, A, B, C, D, initial_state):
    """Independent ground truth: per (batch, head) explicit Python loops in float64."""
    x, dt, A, B, C, D, h0 = (t.detach().double() for t in (x, dt, A, B, C, D, initial_state))
    batch, L, H, P = x.shape
    G = B.shape[2]
    y = torch.empty_like(x)
    final = torch.empty_like(h0)
    for b in range(batch):
        for h in range(H):
            g = h // (H // G)
            state = h0[b, h].clone()
            for t in range(L):
                state = torch.exp(dt[b, t, h] * A[h]) * state + dt[b, t, h] * torch.outer(x[b, t, h], B[b, t, g])
                y[b, t, h] = state @ C[b, t, g] + D[h] * x[b, t, h]
            final[b, h] = state
    return y, final


def _inputs(batch, L, H, P, G, N, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)  # noqa: E731
    return dict(
        x=r(batch, L, H, P),
        dt=torch.nn.functional.softplus(r(batch, L, H) - 1),
        A=-torch.rand(H, generator=g, dtype=dtype) * 3 - 0.1,
        B=r(batch, L, G, N),
        C=r(batch, L, G, N),
        D=r(H),
        initial_state=r(batch, H, P, N),
    )


def _run(backend, inp, chunk_size):
    inp = {k: v.clone().requires_grad_(True) for k, v in inp.items()}
    y, final = ssd(**inp, chunk_size=chunk_size, return_final_state=True, backend=backend)
    g = torch.Generator().manual_seed(11)
    wy = torch.randn(y.shape, generator=g, dtype=torch.float64).to(y.device, y.dtype)
    wf = torch.randn(final.shape, generator=g, dtype=torch.float64).to(y.device, y.dtype)
    loss = (y * wy).sum() + (final * wf).sum()
    grads = torch.autograd.grad(loss, list(inp.values()))
    return y.detach(), final.detach(), dict(zip(inp, grads))


def test_reference_matches_loop():
    inp = _inputs(2, 7, 4, 3, 2, 5, torch.float64, 0)
    y, final = ssd(**inp, return_final_state=True, backend="reference")
    y_loop, final_loop = _loop(**inp)
    torch.testing.assert_close(y, y_loop, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(final, final_loop, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("L,chunk", [(1, 4), (13, 4), (17, 16), (33, 8), (8, 8)])
def test_torch_float64(L, chunk):
    inp = _inputs(2, L, 4, 3, 2, 5, torch.float64, L)
    y_ref, f_ref, g_ref = _run("reference", inp, chunk)
    y_loop, f_loop = _loop(**inp)
    torch.testing.assert_close(y_ref, y_loop, rtol=1e-12, atol=1e-12)
    y, f, g = _run("torch", inp, chunk)
    torch.testing.assert_close(y, y_loop, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(f, f_loop, rtol=1e-10, atol=1e-10)
    for k in g_ref:
        torch.testing.assert_close(g[k], g_ref[k], rtol=1e-9, atol=1e-10, msg=f"grad {k}")


def test_torch_float32():
    inp = _inputs(1, 37, 2, 8, 1, 16, torch.float32, 5)
    y, f, g = _run("torch", inp, 16)
    y64, f64, g64 = _run("reference", {k: v.double() for k, v in inp.items()}, 16)
    torch.testing.assert_close(y, y64.float(), rtol=1e-4, atol=1e-4)
    for k in g64:
        torch.testing.assert_close(g[k], g64[k].float(), rtol=1e-3, atol=1e-3, msg=f"grad {k}")


def test_bad_inputs():
    inp = _inputs(1, 5, 4, 3, 2, 5, torch.float32, 0)
    with pytest.raises(ValueError, match="multiple of the number of B/C groups"):
        ssd(**{**inp, "B": inp["B"][:, :, :1].expand(1, 5, 3, 5), "C": inp["C"][:, :, :1].expand(1, 5, 3, 5)})
    with pytest.raises(ValueError, match="dt has shape"):
        ssd(**{**inp, "dt": inp["dt"][:, :4]})
    with pytest.raises(ValueError, match="A has shape"):
        ssd(**{**inp, "A": inp["A"][:2]})
    with pytest.raises(ValueError, match="x must have 4 dims"):
        ssd(**{**inp, "x": inp["x"][0]})
    with pytest.raises(ValueError, match="initial_state"):
        ssd(**{**inp, "initial_state": inp["initial_state"][:, :2]})
    with pytest.raises(ValueError, match="chunk_size"):
        ssd(**inp, chunk_size=0)
    with pytest.raises(TypeError, match="floating point"):
        ssd(**{**inp, "x": inp["x"].long()})
    with pytest.raises(ValueError, match="unknown ssd backend 'cuda'; valid: auto, reference, torch"):
        ssd(**inp, backend="cuda")


# --- Triton (CPU interpreter at small shapes; CUDA when present) ---------------------------------

needs_triton = pytest.mark.skipif("triton" not in SSD_BACKENDS, reason="triton not importable")


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on the CPU, compiled kernels on a GPU


@needs_triton
@pytest.mark.parametrize(
    "batch,L,H,P,G,N,chunk",
    [
        (1, 1, 2, 16, 1, 16, 16),
        (2, 37, 4, 16, 2, 16, 16),
        (1, 17, 2, 8, 1, 5, 16),
        (1, 67, 4, 32, 1, 32, 32),
        (1, 19, 2, 16, 1, 80, 16),
        # chunk 128 > the 32-row tiles of float32 with a state > 64 (four row tiles per chunk, the path
        # of state 128 on a GPU), several state tiles, a partial last chunk
        (1, 150, 2, 16, 1, 72, 128),
    ],
)
@pytest.mark.parametrize("small_launch_rows", [True, False], ids=["narrowed", "wide"])
@pytest.mark.slow
def test_triton_matches_reference(poison, monkeypatch, batch, L, H, P, G, N, chunk, small_launch_rows):
    """Default tiles; ``narrowed``: as these small launches run (32-row programs, ``attn_config``),
    ``wide``: with the rows of a large launch."""
    from seqkernels.ssd import triton_ops
    from seqkernels.ssd.triton_ops import attn_config

    if not small_launch_rows:
        monkeypatch.setattr(triton_ops, "FEW_PROGRAMS", 1)

    inp = _inputs(batch, L, H, P, G, N, torch.float64, 100 + L)
    y, f, g = _run("triton", {k: v.float().to(DEV) for k, v in inp.items()}, chunk)
    y_ref, f_ref, g_ref = _run("reference", inp, chunk)
    assert _rel(y.cpu(), y_ref) < 1e-5 and _rel(f.cpu(), f_ref) < 1e-5
    for k in g_ref:
        assert _rel(g[k].cpu(), g_ref[k]) < 1e-4, k
    if chunk == 128:  # the case exists for this path: keep it exercised if the tile rule changes
        assert attn_config(chunk, N, P, 4)["BT"] < chunk


@needs_triton
@pytest.mark.slow
def test_triton_explicit_tiles(poison):
    """``SsdTiles``: 16-row ``chunk_attn`` tiles on 2 warps with 2 stages, 16 x 16 ``chunk_state`` tiles of
    16-step blocks on 2 warps: several row, state and step tiles per 64-step chunk, against the reference."""
    from seqkernels.ssd.triton_ops import SsdTiles

    tiles = SsdTiles(
        attn_rows=16,
        attn_warps=2,
        attn_stages=2,
        state_rows=16,
        state_cols=16,
        state_steps=16,
        state_warps=2,
        state_stages=2,
    )
    _check_tiles(tiles, 70, 2, 1, 64, 31, P=24, N=20)


def _check_tiles(tiles, L, H, G, chunk, seed, P=16, N=24):
    """``ssd_triton`` with ``tiles`` against the reference: output, final state and every gradient
    (``FEW_PROGRAMS`` off: these small launches run the rows they are given)."""
    from unittest import mock

    from seqkernels.ssd import triton_ops

    with mock.patch.object(triton_ops, "FEW_PROGRAMS", 1):
        _check_given_tiles(tiles, L, H, G, chunk, seed, P, N)


def _check_given_tiles(tiles, L, H, G, chunk, seed, P, N):
    from seqkernels.ssd.triton_ops import ssd_triton

    inp = _inputs(1, L, H, P, G, N, torch.float64, seed)
    leaves = {k: v.float().to(DEV).requires_grad_() for k, v in inp.items() if k != "D"}
    y, f = ssd_triton(**leaves, chunk_size=chunk, tiles=tiles)
    g = torch.autograd.grad((y * y).sum() + f.sum(), list(leaves.values()))
    ref = {k: v.requires_grad_() for k, v in inp.items() if k != "D"}
    y_ref, f_ref = SSD_BACKENDS["reference"](**ref)
    g_ref = torch.autograd.grad((y_ref * y_ref).sum() + f_ref.sum(), list(ref.values()))
    assert _rel(y.cpu(), y_ref) < 1e-5 and _rel(f.cpu(), f_ref) < 1e-5
    for a, b, k in zip(g, g_ref, ref):
        assert _rel(a.cpu(), b) < 1e-4, k


@needs_triton
@pytest.mark.parametrize(
    "spec",
    [
        # column blocks narrower than the rows in every role, pipelined; 2 of the 4 heads per dB/dC program
        "attn_rows=64,attn_cols=16,attn_stages=2,attn_heads=2",
        # every role its own tile (one row tile per chunk, two, four), one head per dB/dC program
        (
            "fwd_rows=32,fwd_cols=16,dx_rows=64,dx_cols=32,dx_warps=2,db_rows=16,dc_rows=64,dc_cols=16,dc_stages=3,"
            "db_heads=1,dc_heads=2,state_steps=16"
        ),
    ],
)
@pytest.mark.slow
def test_triton_role_tiles(poison, spec):
    """Per-role ``chunk_attn`` tiles with ``BC < BT`` and fewer heads per program than per group, at a
    length that is not a multiple of the chunk (3 chunks, the last partial), against the reference."""
    from seqkernels.ssd.triton_ops import SsdTiles

    _check_tiles(SsdTiles.parse(spec), 150, 4, 1, 64, 41)


@needs_triton
@pytest.mark.parametrize("name", ["h100", "h200"])
@pytest.mark.slow
def test_triton_tile_sets(poison, name):
    """Each named tile set (``TILE_SETS``) at chunk 128 on 150 steps (two chunks, the last partial)."""
    from seqkernels.ssd.triton_ops import SsdTiles

    _check_tiles(SsdTiles.parse(name), 150, 4, 2, 128, 43)


@needs_triton
def test_tile_choices():
    """Every device's default names a tile set (a CPU: the H100 tiles); column blocks must divide the rows."""
    from seqkernels.ssd.triton_ops import DEVICE_TILES, TILE_SETS, SsdTiles, attn_config, default_tiles

    assert all(v in TILE_SETS for v in DEVICE_TILES.values())
    assert default_tiles(torch.device("cpu")) == TILE_SETS["h100"] == SsdTiles()
    assert attn_config(128, 64, 64, 2, tiles=[128, 32])["BC"] == 32
    # small launches halve their rows down to 32 (given rows too); large ones keep them
    table6 = attn_config(64, 64, 16, 4, Lp=128, lanes=16 * 4)  # Mamba2 of Table 6, forward
    assert table6["BT"] == table6["BC"] == 32 and attn_config(64, 64, 16, 4)["BT"] == 64
    assert attn_config(128, 64, 64, 2, tiles=[128, 32], Lp=128, lanes=16)["BT"] == 32
    assert attn_config(128, 64, 64, 2, Lp=4096, lanes=16 * 4)["BT"] == 128  # the benchmark shape
    assert attn_config(64, 64, 64, 4, Lp=64, lanes=128)["BT"] == 32  # 1 x 128 programs < 256
    assert attn_config(64, 64, 64, 4, Lp=128, lanes=128)["BT"] == 64  # 2 x 128 programs
    with pytest.raises(ValueError, match="divide"):
        attn_config(128, 64, 64, 2, tiles=[64, 8])


@needs_triton
def test_triton_16bit_decay_gradient():
    """float16 x, B, C: the decay gradient must stay at float16 accuracy. Formed as row sums minus
    column sums of the intra-chunk terms (the old form), their rounding errors cancel badly:
    dA 4.4e-2 off, ddt 9.6e-4 here; summed from non-cancelling terms: 1.8e-3 and 3.9e-4."""
    inp = _inputs(1, 64, 2, 16, 1, 16, torch.float64, 21)
    half = {k: (v.half() if k in ("x", "B", "C") else v.float()).to(DEV) for k, v in inp.items()}
    _, _, g = _run("triton", half, 32)
    _, _, g_ref = _run("reference", {k: v.double().cpu() for k, v in half.items()}, 32)
    for k in g_ref:  # float16 unit roundoff 4.9e-4
        assert _rel(g[k].cpu(), g_ref[k]) < (5e-3 if k == "A" else 2e-3), k


@needs_triton
def test_triton_without_initial_state():
    inp = {k: v.to(DEV) for k, v in _inputs(1, 20, 2, 16, 1, 16, torch.float32, 3).items()}
    inp.pop("initial_state")
    y = ssd(**inp, chunk_size=16, backend="triton")
    torch.testing.assert_close(y, ssd(**inp, chunk_size=16, backend="torch"), rtol=1e-4, atol=1e-4)


@needs_triton
@pytest.mark.parametrize("reverse", [False, True])
def test_launch_ops_match_their_fakes(reverse):
    """Each launch op's outputs have the shapes, dtypes and strides its fake kernel promises (what
    ``torch.compile`` plans with), at a length that is not a multiple of the chunk, with a transposed
    state operand and per-group outputs (``out_heads < H``) as the backward passes them."""
    from seqkernels.ssd.triton_ops import _decays, ssd_chunk_attn, ssd_chunk_dots, ssd_chunk_state

    inp = {k: v.to(DEV) for k, v in _inputs(2, 20, 4, 16, 2, 16, torch.float32, 5).items()}
    x, B, C = inp["x"], inp["B"], inp["C"]
    dtT, acum = _decays(inp["dt"], inp["A"], 16)
    tiles = [0] * 5  # defaults: [rows, cols, warps, stages, heads] / [rows, cols, steps, warps, stages]
    checks = ("test_schema", "test_faketensor")
    prev, _ = ssd_chunk_state(x, B, inp["initial_state"], acum, dtT, None, 16, "ieee", False, tiles)
    state_args = (x, B, inp["initial_state"], acum, dtT, prev if reverse else None, 16, "ieee", reverse, tiles)
    torch.library.opcheck(ssd_chunk_state, state_args, test_utils=checks)
    pad = lambda t: torch.nn.functional.pad(t, (0, 0, 0, 0, 0, 12)).view(2, 2, 16, 2, 16).transpose(2, 3)  # noqa: E731
    cb = ssd_chunk_dots(pad(C), pad(B), "ieee")
    torch.library.opcheck(ssd_chunk_dots, (pad(C), pad(B), "ieee"), test_utils=checks)
    attn_args = (
        x,
        x,
        C,
        prev[:, :-1],
        acum,
        dtT,
        C if reverse else None,
        None if reverse else cb,
        16,
        "ieee",
        reverse,
        2 if reverse else 4,
        torch.float32,
        reverse,
        not reverse,
        tiles,
    )
    torch.library.opcheck(ssd_chunk_attn, attn_args, test_utils=checks)


@needs_triton
@pytest.mark.slow
def test_compiled_graph_matches_eager():
    """``torch.compile`` traces the SSD's autograd (its glue visible, its launches through the custom
    ops) in one graph: same output and gradients as the eager path. ``aot_eager`` on the CPU (no C++
    toolchain needed), Inductor on a GPU."""
    inp = {k: v.float().to(DEV) for k, v in _inputs(2, 37, 4, 16, 2, 16, torch.float64, 8).items() if k != "D"}
    backend = "inductor" if DEV == "cuda" else "aot_eager"

    def loss(**t):
        y, f = SSD_BACKENDS["triton"](**t, chunk_size=16)
        return (y * y).sum() + (f * f).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, backend=backend, fullgraph=True)
    leaves = lambda: {k: v.clone().requires_grad_() for k, v in inp.items()}  # noqa: E731
    a, b = leaves(), leaves()
    la, lb = loss(**a), compiled(**b)
    ga = torch.autograd.grad(la, list(a.values()))
    gb = torch.autograd.grad(lb, list(b.values()))
    assert _rel(lb.detach(), la.detach()) < 1e-5
    for x, y, k in zip(gb, ga, a):
        assert _rel(x, y) < 1e-4, k


@pytest.fixture
def no_vmap_fallback():
    """Inside the test an op without a vmap rule fails instead of looping over the vmapped models."""
    old = torch._C._functorch._is_vmap_fallback_enabled()
    torch._C._functorch._set_vmap_fallback_enabled(False)
    yield
    torch._C._functorch._set_vmap_fallback_enabled(old)


@needs_triton
@pytest.mark.parametrize("shared", ["", "A", "initial_state"])
@pytest.mark.slow
def test_vmap_folds_models_into_heads(poison, no_vmap_fallback, shared):
    """``torch.func.vmap`` over 3 models' SSDs (4 heads in 2 groups each, a partial last chunk): each
    launch's vmap rule runs one launch over 12 heads (no per-model fallback loop), with the same
    outputs and gradients as each model's SSD on its own; an input left out of the vmap (``shared``)
    is every model's."""
    n = 3
    inp = [_inputs(1, 20, 4, 16, 2, 16, torch.float64, 40 + i) for i in range(n)]
    stacked = {k: torch.stack([v[k] for v in inp]).float().to(DEV).requires_grad_() for k in inp[0] if k != "D"}
    if shared:
        stacked[shared] = stacked[shared][0].detach().requires_grad_()
    names = list(stacked)

    def one(*t):
        return ssd(**dict(zip(names, t)), chunk_size=16, return_final_state=True, backend="triton")

    y, final = torch.func.vmap(one, in_dims=tuple(None if k == shared else 0 for k in names))(*stacked.values())
    g = torch.Generator().manual_seed(3)
    wy, wf = (torch.randn(t.shape, generator=g).to(DEV) for t in (y, final))
    grads = torch.autograd.grad((y * wy).sum() + (final * wf).sum(), list(stacked.values()))
    shared_grad = 0
    for i in range(n):
        leaves = {k: (v if k == shared else v[i]).detach().clone().requires_grad_() for k, v in stacked.items()}
        y_i, f_i = one(*leaves.values())
        assert _rel(y[i], y_i) < 1e-5 and _rel(final[i], f_i) < 1e-5
        g_i = torch.autograd.grad((y_i * wy[i]).sum() + (f_i * wf[i]).sum(), list(leaves.values()))
        for k, a, b in zip(names, grads, g_i):
            if k == shared:
                shared_grad = shared_grad + b
            else:
                assert _rel(a[i], b) < 1e-4, k
    if shared:  # a shared input's gradient sums every model's
        assert _rel(grads[names.index(shared)], shared_grad) < 1e-4


@needs_triton
def test_triton_bad_inputs():
    inp = {k: v.to(DEV) for k, v in _inputs(1, 5, 2, 16, 1, 16, torch.float32, 0).items()}
    with pytest.raises(ValueError, match="power of two"):
        ssd(**inp, chunk_size=48, backend="triton")
    with pytest.raises(TypeError, match="share one dtype"):
        ssd(**{**inp, "B": inp["B"].double()}, backend="triton")


@pytest.fixture
def matmul_precision():
    old = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(old)


# float32 "highest" (the default): 3-pass TF32, float32-accurate; "medium": single-pass TF32
# (inputs rounded to 10-bit mantissas, unit roundoff 2^-11 = 4.9e-4; sums of products and the
# gradients' differences of terms leave a few times that); bfloat16 (2^-8 = 3.9e-3).
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "dtype,precision,tol",
    [(torch.float32, "highest", 1e-4), (torch.float32, "medium", 3e-3), (torch.bfloat16, "highest", 2e-2)],
)
@pytest.mark.parametrize("N", [64, 128])
def test_triton_cuda(matmul_precision, dtype, precision, tol, N):
    matmul_precision(precision)
    inp = {k: v.cuda() for k, v in _inputs(2, 300, 8, 64, 1, N, torch.float64, 9).items()}
    y, f, g = _run("triton", {k: v.to(dtype) for k, v in inp.items()}, 128)
    y_ref, f_ref, g_ref = _run("torch", inp, 64)
    errs = {"y": _rel(y, y_ref), "final": _rel(f, f_ref), **{k: _rel(g[k], g_ref[k]) for k in g_ref}}
    print(f"N={N} {dtype} {precision}: " + " ".join(f"{k} {e:.1e}" for k, e in errs.items()))
    assert all(e < tol for e in errs.values()), errs
