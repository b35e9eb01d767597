"""The Triton scans (seqkernels.scan.triton_ops) against the float64 loop reference: forward and gradients.

CPU runs use the Triton interpreter (small shapes); outputs are poisoned with NaN before every run.
"""

import dataclasses
import math

import pytest
import torch

pytest.importorskip("triton")

import numpy as np  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from seqkernels.scan import linear_scan, linear_scan_block2, resolve_backend  # noqa: E402
from seqkernels.scan import triton_ops as ts  # noqa: E402
from seqkernels.scan._interpret import use_vectorized_interpreter_scan  # noqa: E402
from seqkernels.scan.lookback_kernels import lookback_block2, lookback_diag  # noqa: E402
from seqkernels.scan.reference import linear_scan_block2_reference, linear_scan_reference  # noqa: E402

use_vectorized_interpreter_scan()
DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [pytest.mark.triton, pytest.mark.usefixtures("poison")]  # outputs start as NaN


KINDS = ("lookback", "loop")


def forced(kind, block2=False, **over):
    """The Triton scan with the kernel kind ``kind`` forward and backward (its default tile for the
    shape, fields replaced by ``over``), as ``fn(c, x, reverse)``."""
    fn = ts.linear_scan_block2_triton if block2 else ts.linear_scan_triton

    def run(c, x, reverse=False):
        B, L, D = x.shape[0], x.shape[1], x.shape[-1]
        fwd, bwd = (dataclasses.replace(ts.default_tiles(B, L, D, block2, g, kind=kind), **over) for g in (False, True))
        return fn(c, x, reverse, tiles=fwd, grad_tiles=bwd)

    run.__name__ = f"{fn.__name__}[{kind}{over or ''}]"
    return run


@pytest.fixture(params=KINDS)
def kind(request):
    """Run the test with each kernel kind."""
    return request.param


def small(kind, block2=False, **over):
    """16 x 16 tiles on 4 warps (look-back) / 2 warps, 3 stages (chunk loop): threads replicate lanes."""
    return forced(kind, block2, ch=16, bd=16, warps=4 if kind == "lookback" else 2, stages=3, **over)


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    assert torch.isfinite(a).all(), "non-finite (unwritten?) elements"
    return float((a - b).norm() / b.norm().clamp_min(1e-30)) if b.norm() > 0 else float(a.norm())


def inputs(shape_c, shape_x, gen, dtype=torch.float32):
    # coefficients in (-1.1, 1.1): products may grow a little, as Newton Jacobians do
    c = torch.rand(shape_c, generator=gen, dtype=torch.float64) * 2.2 - 1.1
    x = torch.randn(shape_x, generator=gen, dtype=torch.float64)
    return c.to(DEV, dtype), x.to(DEV, dtype)


def _at_offset(t: torch.Tensor, elements: int) -> torch.Tensor:
    """A contiguous copy of ``t`` that starts ``elements`` elements into a fresh buffer."""
    buf = torch.empty(t.numel() + elements, device=t.device, dtype=t.dtype)
    out = buf[elements:].view(t.shape)
    out.copy_(t)
    return out


def check(fn, ref, c, x, reverse, tol=1e-5, offset=0):
    """``fn`` forward and gradients against ``ref`` in float64; ``offset``: the inputs start that many
    elements into their buffers (``_at_offset``)."""
    c = (_at_offset(c, offset) if offset else c.clone()).requires_grad_()
    x = (_at_offset(x, offset) if offset else x.clone()).requires_grad_()
    if offset:
        assert c.data_ptr() % 16 and x.data_ptr() % 16
    y = fn(c, x, reverse)
    g = torch.randn_like(y)
    (y * g).sum().backward()
    c64 = c.detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    y64 = ref(c64, x64, reverse)
    (y64 * g.double()).sum().backward()
    assert rel(y, y64) < tol
    assert rel(x.grad, x64.grad) < tol
    assert rel(c.grad, c64.grad) < tol


@pytest.mark.parametrize("L", [1, 17, 129])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.slow
def test_diag_matches_reference(kind, L, reverse):
    gen = torch.Generator().manual_seed(L + 7 * reverse)
    c, x = inputs((2, L, 70), (2, L, 70), gen)  # 70 channels: one full and one partial lane tile
    check(forced(kind), linear_scan_reference, c, x, reverse)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU's test (on the CPU: many_chunks_and_lane_tiles)")
@pytest.mark.parametrize("reverse", [False, True])
def test_diag_matches_reference_over_1000_steps(kind, reverse):
    """As above at 1000 steps: 16 chunks of the default tile, past its look-back window. The interpreter
    takes 45 s for it; on the CPU ``test_many_chunks_and_lane_tiles`` chains 13 small chunks instead."""
    test_diag_matches_reference(kind, 1000, reverse)


@pytest.mark.parametrize("L", [1, 17, 129, 1000])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.slow
def test_block2_matches_reference(kind, L, reverse):
    gen = torch.Generator().manual_seed(100 + L + 7 * reverse)
    c, x = inputs((1, L, 2, 2, 5), (1, L, 2, 5), gen)
    c = c * 0.7  # keep 2x2 products bounded over 1000 steps
    check(forced(kind, True), linear_scan_block2_reference, c, x, reverse)


@pytest.mark.parametrize("reverse, spec", [(False, False), (True, True)])
@pytest.mark.slow
def test_many_chunks_and_lane_tiles(kind, reverse, spec):
    """Small tiles: long look-back chains across 13 chunks, 3 batch rows, partial lane tiles; channel
    counts 32 and 16 (multiples of 16: compiled for them when ``spec``) and 37, 19 (runtime)."""
    gen = torch.Generator().manual_seed(3 + reverse)
    for d, d2 in ((37, 19), (32, 16)):
        c, x = inputs((3, 197, d), (3, 197, d), gen)
        check(small(kind, specialize_d=spec), linear_scan_reference, c, x, reverse)
        c, x = inputs((2, 61, 2, 2, d2), (2, 61, 2, d2), gen)
        check(small(kind, True, specialize_d=spec), linear_scan_block2_reference, c * 0.7, x, reverse)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.slow
def test_one_row_tail(kind, reverse):
    """L = 129 with 16-step chunks: the last chunk in memory holds one valid row (the first chunk of a
    reverse scan and of the backward of a forward scan), forward and gradients, diagonal and 2x2."""
    gen = torch.Generator().manual_seed(11 + reverse)
    c, x = inputs((2, 129, 20), (2, 129, 20), gen)
    check(small(kind), linear_scan_reference, c, x, reverse)
    c, x = inputs((1, 129, 2, 2, 5), (1, 129, 2, 5), gen)
    check(small(kind, True), linear_scan_block2_reference, c * 0.7, x, reverse)


# ---- the look-back on records in every published state (the interpreter runs programs in ticket
# order, so the kernels above only ever meet inclusive predecessors; here the records are written by
# hand: per lane, the nearest inclusive chunk is at a different depth, aggregates above it; every word
# not published in this launch holds garbage under another launch's tag, which must read as unpublished)

TAG = 6
STALE_TAGS = (1, 5, 7)  # 1: the published bit of the first record format; 5: the previous launch


def _word(v, tag=TAG):
    """Record word of float32 values ``v`` under launch tag ``tag`` (bits 32-62, the float bits below)."""
    return np.asarray(v, np.float32).view(np.uint32).astype(np.int64) | (tag << 32)


@triton.jit
def _lookback_probe(
    ws_ptr, agg_ptr, out_ptr, k, tag, NW: tl.constexpr, CH: tl.constexpr, BD: tl.constexpr, WIN: tl.constexpr
):
    lanes = tl.arange(0, BD)
    tag = tag.to(tl.int64)
    if NW == 3:
        carry = lookback_diag(
            ws_ptr + lanes, k, tl.load(agg_ptr + lanes), tl.load(agg_ptr + BD + lanes), tag, CH, BD, WIN
        )
        tl.store(out_ptr + lanes, carry)
    else:
        g = agg_ptr + lanes
        r0, r1 = lookback_block2(
            ws_ptr + lanes,
            k,
            tl.load(g),
            tl.load(g + BD),
            tl.load(g + 2 * BD),
            tl.load(g + 3 * BD),
            tl.load(g + 4 * BD),
            tl.load(g + 5 * BD),
            tag,
            CH,
            BD,
        )
        tl.store(out_ptr + lanes, r0)
        tl.store(out_ptr + BD + lanes, r1)


@pytest.mark.parametrize("block2, win", [(False, 1), (False, 3), (False, 8), (True, 1)])
def test_lookback_mixed_record_states(block2, win):
    """Diagonal look-back windows of 1, 3 and 8 records (8 > k: the window reaches below chunk 0)."""
    rng = np.random.default_rng(12 + block2 + win)
    BD, k, n = 16, 7, 2 if block2 else 1  # n: state size per lane
    na, nw = n * n, n * n + 2 * n  # coefficient words, words per record
    depth = rng.integers(0, k, size=BD)  # per lane: the chunk whose inclusive value ends the walk
    A = rng.uniform(-1.1, 1.1, size=(k, n, n, BD))
    Yagg = rng.standard_normal((k, n, BD))
    Yinc = rng.standard_normal((k, n, BD))
    # garbage under stale tags everywhere first (including chunk k's own record)
    stale = rng.choice(STALE_TAGS, size=(k + 1, nw, BD))
    ws = _word(rng.standard_normal((k + 1, nw, BD)) * 100, 0) | (stale << 32)
    want = np.zeros((n, BD))
    for lane in range(BD):
        d = depth[lane]
        ws[d, na + n :, lane] = _word(Yinc[d, :, lane])
        state = Yinc[d, :, lane].astype(np.float32).astype(np.float64)
        for j in range(1, k):  # chunk 0 has no aggregate records
            if j >= d or rng.random() < 0.5:  # below the inclusive chunk, aggregates may or may not be there
                ws[j, :na, lane] = _word(A[j, :, :, lane].reshape(-1))
                ws[j, na : na + n, lane] = _word(Yagg[j, :, lane])
            if j > d:
                a32 = A[j, :, :, lane].astype(np.float32).astype(np.float64)
                state = a32 @ state + Yagg[j, :, lane].astype(np.float32).astype(np.float64)
        want[:, lane] = state
    agg = rng.uniform(-1, 1, size=(na + n, BD)).astype(np.float32)
    out = torch.full((n * BD,), math.nan, device=DEV)
    ws_t = torch.from_numpy(ws.reshape(-1).copy()).to(DEV)
    _lookback_probe[(1,)](ws_t, torch.from_numpy(agg).to(DEV), out, k, TAG, NW=nw, CH=4, BD=BD, WIN=win)
    got = out.double().cpu().numpy().reshape(n, BD)
    ws_t = ws_t.cpu()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # chunk k published its aggregate (unchanged) and its inclusive value agg_y + agg_A @ carry
    rec = ws_t.numpy().reshape(k + 1, nw, BD)[k]
    assert (rec >> 32 == TAG).all()
    vals = (rec & 0xFFFFFFFF).astype(np.uint32).view(np.float32).astype(np.float64)
    np.testing.assert_array_equal(vals[: na + n], agg.astype(np.float64))
    gA = agg[:na].astype(np.float64).reshape(n, n, BD)
    np.testing.assert_allclose(
        vals[na + n :], agg[na:].astype(np.float64) + np.einsum("ijl,jl->il", gA, got), rtol=1e-5, atol=1e-5
    )


def _counter(ws):
    """``(epoch, tickets taken)`` of a workspace's ticket counter (word 0)."""
    word = int(ws[0])
    return word >> 32, word & 0xFFFFFFFF


@pytest.mark.slow
def test_workspace_reused_across_launches(monkeypatch):
    """One cached workspace per stream, never re-zeroed by the host: every launch leaves the counter at
    (next epoch, 0 tickets); records of earlier launches (other layouts too) are ignored. With the launch
    limit set to 3, the host zeroes the workspace every third launch and the epochs start again."""
    monkeypatch.setattr(ts, "_workspaces", {})
    monkeypatch.setattr(ts, "WS_LAUNCH_LIMIT", 3)
    gen = torch.Generator().manual_seed(21)
    c, x = inputs((2, 50, 20), (2, 50, 20), gen)
    C, x2 = inputs((1, 40, 2, 2, 5), (1, 40, 2, 5), gen)
    want = [linear_scan_reference(c.double(), x.double(), r) for r in (False, True)]
    want2 = linear_scan_block2_reference((C * 0.7).double(), x2.double())
    epochs = []
    for launch in range(7):
        if launch == 4:
            got = small("lookback", True)(C * 0.7, x2)
            assert rel(got, want2) < 1e-5
        else:
            rev = bool(launch % 2)
            assert rel(small("lookback")(c, x, rev), want[rev]) < 1e-5, launch
        ((ws, count),) = ts._workspaces.values()
        epoch, tickets = _counter(ws.cpu())
        assert tickets == 0
        epochs.append(epoch)
        assert count == epoch  # the host's launch count since the last zeroing is the device epoch
    assert epochs == [1, 2, 3, 1, 2, 3, 1]


def test_bfloat16_storage(kind):
    gen = torch.Generator().manual_seed(5)
    c, x = inputs((2, 150, 16), (2, 150, 16), gen)
    c = c * 0.9
    y = forced(kind)(c.bfloat16(), x.bfloat16())
    assert y.dtype == torch.bfloat16
    ref = linear_scan_reference(c.bfloat16().double(), x.bfloat16().double())
    assert rel(y, ref) < 1e-2


def test_linear_scan_triton_backend_dispatch():
    gen = torch.Generator().manual_seed(6)
    c, x = inputs((1, 40, 8), (1, 40, 8), gen)
    assert rel(linear_scan(c, x, backend="triton"), linear_scan_reference(c.double(), x.double())) < 1e-5
    # through the backend dict, strided inputs are fine (the custom op itself wants contiguous ones)
    ct, xt = c.transpose(0, 2).contiguous().transpose(0, 2), x.transpose(0, 2).contiguous().transpose(0, 2)
    assert not ct.is_contiguous()
    assert rel(linear_scan(ct, xt, backend="triton"), linear_scan_reference(c.double(), x.double())) < 1e-5
    C, x2 = inputs((1, 40, 2, 2, 8), (1, 40, 2, 8), gen)
    got = linear_scan_block2(C * 0.7, x2, reverse=True, backend="triton")
    assert rel(got, linear_scan_block2_reference((C * 0.7).double(), x2.double(), reverse=True)) < 1e-5


def test_auto_picks_triton_only_on_cuda():
    x = torch.zeros(1, 4, 2)
    assert resolve_backend("auto", x, x) == "torch"  # never the (slow) interpreter on the CPU
    with pytest.raises(ValueError, match="unknown scan backend 'fast'; valid: auto, reference, torch, triton"):
        resolve_backend("fast", x, x)
    if torch.cuda.is_available():
        xc = x.cuda()
        assert resolve_backend("auto", xc, xc) == "triton"
        assert resolve_backend("auto", xc.double(), xc.double()) == "torch"
        assert resolve_backend("auto", xc.transpose(1, 2), xc.transpose(1, 2)) == "triton"


@pytest.mark.parametrize("block2", [False, True])
@pytest.mark.slow
def test_opcheck(block2):
    gen = torch.Generator().manual_seed(8)
    if block2:
        c, x = inputs((2, 20, 2, 2, 3), (2, 20, 2, 3), gen)
        op, bwd = torch.ops.expressivity.linear_scan_block2, torch.ops.expressivity.linear_scan_block2_bwd
    else:
        c, x = inputs((2, 20, 3), (2, 20, 3), gen)
        op, bwd = torch.ops.expressivity.linear_scan, torch.ops.expressivity.linear_scan_bwd
    c = (c * 0.7).requires_grad_()
    x = x.requires_grad_()
    for reverse in (False, True):
        torch.library.opcheck(op, (c, x, reverse))
        y = op(c.detach(), x.detach(), reverse)
        torch.library.opcheck(bwd, (c.detach(), y, torch.randn_like(y), reverse))


def test_bad_inputs_give_clear_errors(monkeypatch):
    x = torch.randn(2, 5, 3, device=DEV)
    with pytest.raises(TypeError, match="dtype"):
        ts.linear_scan_triton(x.double(), x.double())
    with pytest.raises(TypeError, match="dtype"):
        ts.linear_scan_triton(x.half(), x)
    with pytest.raises(ValueError, match="shape"):
        ts.linear_scan_triton(x[:, :4], x)
    with pytest.raises(ValueError, match="expected"):
        ts.linear_scan_triton(x[0], x[0])
    with pytest.raises(ValueError, match="contiguous"):
        torch.ops.expressivity.linear_scan(x.transpose(0, 1), x.transpose(0, 1), False)
    with pytest.raises(ValueError, match="expected"):
        ts.linear_scan_block2_triton(torch.randn(2, 5, 2, 3, 3, device=DEV), torch.randn(2, 5, 2, 3, device=DEV))
    with pytest.raises(TypeError, match="tensors"):
        ts.linear_scan_triton(x.tolist(), x)
    monkeypatch.setattr(ts, "triton_available", lambda t: False)
    with pytest.raises(ValueError, match="CUDA"):
        ts.linear_scan_triton(x, x)


def _grads(fn, c, x, reverse, g):
    c = c.detach().clone().requires_grad_()
    x = x.detach().clone().requires_grad_()
    y = fn(c, x, reverse)
    (y * g).sum().backward()
    return y.detach(), x.grad, c.grad


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("L", [1, 17, 64, 65, 129, 1000, 4097])
def test_gpu_repeated_launches(L):
    """Races show only now and then: per length, poisoned launches of every kernel and tile in ``cfgs``,
    both directions, diagonal and 2x2; forward every time, gradients every fourth time, against the
    float64 loop (computed once). Look-back kernels, 24 launches each (all sharing the stream's cached
    workspace, full of records of earlier launches and other layouts): default tiles, 16x16 on 4 warps
    with a 3-record window and 64x64 on 4 warps with one record per step (both replicate lanes over
    threads). Chunk-loop kernels (no communication between programs), 8 launches each: default tiles,
    16x16 on 2 warps with 3 stages (replicated lanes), 64x64 on 2 warps with 2 stages."""
    cfgs = [
        ("lookback", {}),
        ("lookback", dict(ch=16, bd=16, warps=4, window=3)),
        ("lookback", dict(ch=64, bd=64, warps=4, window=1)),
        ("loop", {}),
        ("loop", dict(ch=16, bd=16, warps=2, stages=3)),
        ("loop", dict(ch=64, bd=64, warps=2, stages=2)),
    ]
    gen = torch.Generator().manual_seed(L)
    c, x = inputs((2, L, 70), (2, L, 70), gen)
    C, x2 = inputs((1, L, 2, 2, 9), (1, L, 2, 9), gen)
    C = C * 0.7
    for reverse in (False, True):
        cases = []
        for block2, ref, cc, xx in ((False, linear_scan_reference, c, x), (True, linear_scan_block2_reference, C, x2)):
            g = torch.randn(xx.shape, generator=gen, dtype=torch.float64).to(DEV)
            cases.append((block2, cc, xx, g.float(), _grads(ref, cc.double(), xx.double(), reverse, g)))
        for kind, over in cfgs:
            for rep in range(24 if kind == "lookback" else 8):
                for block2, cc, xx, g, want in cases:
                    fn = forced(kind, block2, **over)
                    where = (kind, over, reverse, rep, fn.__name__)
                    if rep % 4:
                        assert rel(fn(cc, xx, reverse), want[0]) < 1e-5, where
                    else:
                        for got, w in zip(_grads(fn, cc, xx, reverse, g), want):
                            assert rel(got, w) < 1e-5, where


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "shape, kind",
    [((8, 4096, 1024), None), ((8, 4096, 1024), "lookback"), ((1, 65536, 256), None), ((8, 4096, 2, 512), None)],
)
def test_gpu_benchmark_shapes_repeated(shape, kind):
    """The benchmark shapes (``(B, L, 2, D)``: the 2x2 scan) with the default tiles and kernel choice
    (``kind``: forced instead): 20 poisoned forward launches each direction, against the float64
    log-step scan, then the gradients once per direction against autograd through it in float64."""
    from seqkernels.scan.pytorch import linear_scan_block2_torch, linear_scan_torch

    block2 = len(shape) == 4
    g = torch.Generator(device="cuda").manual_seed(13)
    if block2:
        B, L, _, D = shape
        c = (torch.rand((B, L, 2, 2, D), device="cuda", generator=g) - 0.5) * 0.9
        c[:, :, 0, 0] += 0.5
        c[:, :, 1, 1] += 0.5
        ref = linear_scan_block2_torch
    else:
        c = torch.rand(shape, device="cuda", generator=g) * 0.2 + 0.8
        ref = linear_scan_torch
    fn = forced(kind, block2)
    x = torch.randn(shape, device="cuda", generator=g)
    for reverse in (False, True):
        y64 = ref(c.double(), x.double(), reverse=reverse)
        for rep in range(20):
            y = fn(c, x, reverse)
            assert torch.isfinite(y).all()
            err = float((y.double() - y64).abs().max() / y64.abs().max())  # a wrong carry: O(1)
            assert err < 1e-5, (reverse, rep, err)
        del y64
        dy = torch.randn(shape, device="cuda", generator=g)
        for got, want in zip(_grads(fn, c, x, reverse, dy), _grads(ref, c.double(), x.double(), reverse, dy.double())):
            assert rel(got, want) < 1e-5, reverse
        torch.cuda.empty_cache()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shape", [(2, 4099, 300), (1, 65537, 64)])
def test_gpu_large(shape):
    gen = torch.Generator().manual_seed(9)
    c, x = inputs(shape, shape, gen)
    c = c.clamp(-1, 1)
    for reverse in (False, True):
        check(ts.linear_scan_triton, linear_scan_reference, c, x, reverse, tol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_concurrent_streams():
    """Launches on two streams may overlap, so each stream has its own workspace (ticket counter and
    records): 10 rounds of one launch per stream at once, every output checked."""
    gen = torch.Generator().manual_seed(17)
    c, x = inputs((4, 3000, 256), (4, 3000, 256), gen)
    c = c.clamp(-1, 1)
    want = linear_scan_reference(c.double(), x.double())
    streams = [torch.cuda.Stream() for _ in range(2)]
    torch.cuda.synchronize()
    for _ in range(10):
        outs = []
        for s in streams:
            with torch.cuda.stream(s):
                outs.append(ts.linear_scan_triton(c, x))
        torch.cuda.synchronize()
        for y in outs:
            assert rel(y, want) < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_launch_cache():
    """Repeated eager launches go through the plan's ``LaunchCache`` (the compiled kernel's launcher,
    not the JIT): forward and gradients against float64 for both kernel kinds, float32 and bfloat16 at
    one shape (two specializations of one plan), and inputs 4 bytes off 16-byte alignment between
    aligned calls (the JIT's misaligned specialization, never the cached one)."""
    gen = torch.Generator().manual_seed(23)
    shape = (2, 777, 96)
    for kind in KINDS:
        fn = forced(kind)
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
            for rnd in range(4):
                c, x = inputs(shape, shape, gen, dtype)
                # the third round misaligned, after the cache holds the aligned kernel
                check(fn, linear_scan_reference, c.clamp(-1, 1), x, bool(rnd % 2), tol, offset=1 if rnd == 2 else 0)
        fwd = ts.default_tiles(*shape, False, False, kind=kind)
        launches = ts._plan(*shape, False, False, False, fwd)[-1]
        assert {key[1] for key in launches._compiled} == {torch.float32, torch.bfloat16}, "cache not used"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_launch_cache_honours_launch_hooks(monkeypatch):
    """With a Triton launch hook set (a profiler), every launch goes through the JIT, which calls it."""
    from triton import knobs

    gen = torch.Generator().manual_seed(29)
    c, x = inputs((1, 300, 64), (1, 300, 64), gen)
    want = linear_scan_reference(c.double(), x.double())
    for _ in range(2):
        ts.linear_scan_triton(c, x)  # fills the cache
    seen = []
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: seen.append(metadata))
    assert rel(ts.linear_scan_triton(c, x), want) < 1e-5
    assert len(seen) == 1


def test_launch_hooks_detected(monkeypatch):
    """``LaunchCache`` takes the JIT whenever a Triton launch hook is set: ``None`` and an empty hook
    chain are unset; a function, or a chain with a hook registered, is set."""
    from triton import knobs

    from seqkernels._triton import _launch_hooks_set

    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", None)
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", None)
    assert not _launch_hooks_set()
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", lambda metadata: None)
    assert _launch_hooks_set()
    if hasattr(knobs, "HookChain"):
        chain = knobs.HookChain()
        monkeypatch.setattr(knobs.runtime, "launch_exit_hook", chain)
        assert not _launch_hooks_set()
        chain.add(print)
        assert _launch_hooks_set()
