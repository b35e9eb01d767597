"""RWKV-7's DPLR rule on ``backend="triton_chunk"`` (``seqkernels/delta/triton_dplr.py``): the inter-chunk scan
kernels (``dplr_scan_kernels.py``) against ``pytorch.dplr_scan``'s loop in float64, forward and every input
gradient, at awkward chunk, key and value sizes, several value blocks, one chunk, outputs poisoned with NaN;
the whole rule, on the fused kernels (``dplr_chunk_kernels.py``, under a decay bound) and on PyTorch's chunk
form with the scan (pairwise decays, other chunk sizes, wider heads), against the float64 per-token reference
(itself checked against dense matrices in ``test_delta.py``), with and without a decay bound; the custom ops
under ``opcheck``, through their registered autograd and ``torch.compile``. On the CPU in the interpreter at
small shapes; on a GPU (``-m gpu``) at lengths up to 1,024 and head dims 16 to 128, in float32 and bfloat16, in a
CUDA graph.
"""

import pytest
import torch

from seqkernels import delta as kd
from seqkernels._triton import poisoned, triton_available
from seqkernels.delta import pytorch as kc
from seqkernels.delta import triton_dplr
from seqkernels.delta.triton_dplr import ScanTiles, dplr_scan_bwd, dplr_scan_fwd
from tests.kernels.test_delta import RWKV7_BOUND
from tests.kernels.test_delta import _dplr_inputs as _leaf_inputs
from tests.kernels.test_delta_triton_chunk import compare_with_reference, rel

F64 = torch.float64
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not triton_available(torch.empty(0, device=DEVICE)), reason="needs CUDA or TRITON_INTERPRET=1"
)


def _scan_inputs(lead, NC, C, K, V, seed):
    """The scan's inputs like the chunk form's: ``U_v, W, b_end, k_end, v`` Gaussian (``W``, ``b_end`` scaled
    so the state stays bounded), ``decay_end`` in ``(0, 1)``; float64 on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*lead, *s, generator=gen, dtype=F64)  # noqa: E731
    return [
        r(NC, C, V),
        0.3 * r(NC, C, K),
        0.3 * r(NC, C, K),
        r(NC, C, K),
        r(NC, C, V),
        torch.rand(*lead, NC, K, generator=gen, dtype=F64),
    ]


@pytest.mark.parametrize(
    "lead,NC,C,K,V,tiles",
    [
        ((2, 3), 3, 5, 7, 6, None),  # nothing a power of two, one padded tile each
        ((1, 2), 4, 16, 20, 40, ScanTiles(block_v=16)),  # 3 value blocks, the last partial
        ((1, 1), 1, 1, 4, 3, None),  # one chunk of one step
        ((2, 1), 2, 64, 16, 16, ScanTiles(precision="ieee", warps=2, stages=2)),
    ],
)
def test_scan_equals_the_loop_with_gradients(lead, NC, C, K, V, tiles):
    xs = _scan_inputs(lead, NC, C, K, V, seed=NC + C + K)
    slow = [x.clone().requires_grad_() for x in xs]
    fast = [x.float().to(DEVICE).requires_grad_() for x in xs]
    U0, M0 = kc.dplr_scan(*slow)
    with poisoned():
        U1, M1 = triton_dplr.dplr_scan(*fast, tiles=tiles)
    assert rel(U1.cpu(), U0) < 1e-5 and rel(M1.cpu(), M0) < 1e-5
    gen = torch.Generator().manual_seed(1)
    dU, dM = torch.randn(U0.shape, generator=gen, dtype=F64), torch.randn(M0.shape, generator=gen, dtype=F64)
    want = torch.autograd.grad((U0 * dU).sum() + (M0 * dM).sum(), slow, allow_unused=True, materialize_grads=True)
    with poisoned():
        got = torch.autograd.grad((U1 * dU.float().to(DEVICE)).sum() + (M1 * dM.float().to(DEVICE)).sum(), fast)
    floor = 1e-2 * max(float(w.norm()) for w in want)
    errors = [rel(g.cpu(), w, floor) for g, w in zip(got, want)]
    assert all(e < 1e-5 for e in errors), errors


def _dplr_inputs(B, L, H, K, V, seed, decay):
    """``test_delta``'s RWKV-7 DPLR inputs (``a = -kk``, ``b = kk * lr``, log decays in ``[-decay, 0]``),
    float64 on the CPU, detached."""
    return [x.detach() for x in _leaf_inputs(B, L, H, K, V, seed, decay)]


def _compare(shape, dtype, tol, lower_bound, chunk=None, tiles=None, seed=0):
    """``triton_chunk`` on ``dtype`` copies against the reference on the same values in float64: output and every
    gradient (relative to the reference's norm, gradients to at least 1% of the largest gradient's)."""
    xs = [x.to(dtype).double() for x in _dplr_inputs(*shape, seed=seed, decay=-(lower_bound or -2.0))]
    fast = lambda *t: triton_dplr.dplr_delta_rule(  # noqa: E731
        *t, scale=0.7, lower_bound=lower_bound, chunk=chunk, tiles=tiles
    )
    compare_with_reference(
        fast, lambda *t: kd.dplr_delta_rule(*t, scale=0.7, backend="reference"), xs, dtype, tol, seed + 1
    )


@pytest.mark.parametrize(
    "shape,lower_bound,chunk,tiles",
    [
        ((2, 1, 1, 4, 4), None, None, None),  # one step
        ((2, 13, 3, 5, 3), None, None, None),  # pairwise decays, chunks of 16, one partial
        ((1, 37, 2, 8, 6), None, 5, None),  # chunks of 5
        ((1, 37, 2, 8, 6), RWKV7_BOUND, 5, None),  # factored in PyTorch: chunks of 5 (not a fused size)
        ((1, 20, 1, 72, 8), RWKV7_BOUND, 64, None),  # factored in PyTorch: chunks of 64 at keys wider than 64
        ((1, 12, 1, 130, 8), RWKV7_BOUND, None, None),  # factored in PyTorch: keys wider than the fused kernels'
        # the fused kernels
        ((2, 1, 1, 4, 4), RWKV7_BOUND, None, None),  # one step in a chunk of 16
        ((1, 70, 2, 12, 20), RWKV7_BOUND, None, None),  # five chunks of 16, the last partial
        ((1, 20, 2, 8, 6), RWKV7_BOUND, 32, None),  # one partial chunk of 32
        ((1, 130, 1, 16, 16), RWKV7_BOUND, 64, None),  # chunks of 64, the last partial
        ((1, 67, 1, 20, 40), RWKV7_BOUND, None, ScanTiles(block_v=16)),  # 3 value blocks, kernels and scan
        ((1, 40, 1, 128, 72), RWKV7_BOUND, None, ScanTiles(block_v=32)),  # head 128, 3 value blocks
        ((1, 40, 1, 24, 72), RWKV7_BOUND, None, ScanTiles(chunk_block_v=32)),  # 3 blocks in the fused kernels only
        ((1, 40, 1, 24, 40), RWKV7_BOUND, None, ScanTiles(block_v=16, chunk_block_v=64)),  # 3 in the scan only
        ((2, 90, 1, 64, 33), -1.0, 32, None),  # a looser bound: chunks of 32 at most
    ],
)
def test_triton_chunk_equals_reference(shape, lower_bound, chunk, tiles):
    _compare(shape, torch.float32, 1e-5, lower_bound, chunk, tiles, seed=shape[1] + shape[3])


@pytest.mark.parametrize("shape", [(1, 70, 2, 16, 16), (1, 20, 1, 128, 100)])  # the second: one 128-column block
def test_bfloat16_products_are_within_their_rounding(shape):
    """``ScanTiles(precision="bf16")``: the fused kernels and the scan multiply bfloat16-rounded operands (fla's
    precision): within 3e-2 of the float64 reference, and further from it than float32 products."""
    _compare(shape, torch.float32, 3e-2, RWKV7_BOUND, None, ScanTiles(precision="bf16"), seed=11)
    with pytest.raises(AssertionError):
        _compare(shape, torch.float32, 1e-5, RWKV7_BOUND, None, ScanTiles(precision="bf16"), seed=11)


def test_value_blocks_of_the_fused_kernels():
    """Under bfloat16 products the fused kernels take every value column up to 128 in one block, under the
    others up to 64; ``chunk_block_v`` (or ``block_v``) overrides both."""
    q, v = torch.empty(1, 16, 1, 128), torch.empty(1, 16, 1, 100)
    nv = {t: triton_dplr._chunk_meta(q, v, 16, t)[6] for t in (ScanTiles(precision="bf16"), ScanTiles())}
    assert list(nv.values()) == [1, 2]
    assert triton_dplr._chunk_meta(q, v, 16, ScanTiles(precision="bf16", chunk_block_v=32))[6] == 4
    assert triton_dplr._chunk_meta(q, v, 16, ScanTiles(block_v=16))[6] == 7


def test_bfloat16_products_save_the_state_in_bfloat16():
    """Under ``"bf16"`` products the fused forward saves each chunk's entering state in bfloat16 (every product
    reading it rounds it so): the float32 state rounded, within one bfloat16 step of it (the interpreter's cast
    truncates, the GPU's rounds to nearest); float32 at the other precisions."""
    xs = [x.to(DEVICE, torch.float32) for x in _dplr_inputs(1, 40, 1, 16, 16, seed=5, decay=-RWKV7_BOUND)]
    saved = {p: triton_dplr._fused_fwd(*xs, 1.0, 16, ScanTiles(precision=p))[2] for p in ("bf16", "tf32x3")}
    assert saved["bf16"].dtype == torch.bfloat16 and saved["tf32x3"].dtype == torch.float32
    Uv, Wy, Be, Ke, D, _ = triton_dplr._fused_prep(
        *xs[1:], triton_dplr._chunk_meta(xs[0], xs[2], 16, ScanTiles(precision="bf16"))
    )
    _, M_in = triton_dplr._scan_fwd(Uv, Wy, Be, Ke, xs[2], D, ScanTiles(precision="bf16"), heads=1)
    gap = (saved["bf16"].float() - M_in).abs()
    assert M_in.dtype == torch.float32 and bool((gap <= 2**-7 * M_in.abs()).all()) and float(gap.max()) > 0


@pytest.mark.parametrize("L,V,tiles", [(37, 16, None), (50, 40, ScanTiles(block_v=16))])
def test_scan_backward_forms_the_outputs_state_gradient_from_their_rows(L, V, tiles):
    """``_scan_bwd``'s ``out_rows`` (the fused path: the state's output gradient ``scale (q o exp(c))^T dO`` per
    chunk formed on chip from the token rows, a partial last chunk, value blocks) gives the gradients that the
    same ``dM_in`` computed in float64 and passed as a tensor gives."""
    B, H, K, C, scale = 1, 2, 12, 16, 0.3
    q, k, v, a, b, w = (x.float().to(DEVICE) for x in _dplr_inputs(B, L, H, K, V, seed=L, decay=-RWKV7_BOUND))
    do = torch.randn(B, L, H, V, generator=torch.Generator().manual_seed(L)).to(DEVICE)
    geometry = triton_dplr._chunk_meta(q, v, C, tiles)
    Uv, Wy, Be, Ke, D, _ = triton_dplr._fused_prep(k, v, a, b, w, geometry)
    U, M_in = triton_dplr._scan_fwd(Uv, Wy, Be, Ke, v, D, tiles, heads=H)
    NC, pad = -(-L // C), -L % C

    def chunked(x):  # (B, L, H, D) -> (B H, NC, C, D), float64, zeros past L
        x = torch.nn.functional.pad(x.double().cpu(), (0, 0, 0, 0, 0, pad))
        return x.reshape(B, NC, C, H, x.shape[-1]).movedim(3, 1).reshape(B * H, NC, C, x.shape[-1])

    q_s = chunked(q) * chunked(w).cumsum(-2).exp()
    dM_in = (scale * q_s.transpose(-1, -2) @ chunked(do)).float().to(DEVICE)
    dU = torch.randn(U.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    want = triton_dplr._scan_bwd(dU, dM_in, Wy, Be, Ke, v, D, U, M_in, tiles, heads=H)
    got = triton_dplr._scan_bwd(dU, None, Wy, Be, Ke, v, D, U, M_in, tiles, H, (q, w, do.contiguous(), scale))
    assert all(rel(g, x) < 1e-5 for g, x in zip(got, want)), [rel(g, x) for g, x in zip(got, want)]


def test_prep_backward_sums_the_scans_value_block_shares():
    """The fused prep backward reads the scan backward's per-value-block shares of ``dW, dBe, dKe, dD`` (three
    blocks of 16 of 40 values, two heads) and sums them itself: the gradients equal those from the shares summed
    first, and differ from those of block 0's share alone."""
    B, L, H, K, V, C = 2, 37, 2, 12, 40, 16
    q, k, v, a, b, w = (x.float().to(DEVICE) for x in _dplr_inputs(B, L, H, K, V, seed=3, decay=-RWKV7_BOUND))
    do = torch.randn(B, L, H, V, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    tiles = ScanTiles(block_v=16, chunk_block_v=64)  # three value blocks in the scan, one in the fused kernels
    geometry = triton_dplr._chunk_meta(q, v, C, tiles)
    _, U, M_in, Wy, Be, Ke, D, Tm = triton_dplr._fused_fwd(q, k, v, a, b, w, 0.3, C, tiles)
    dU, _, *out_shares = triton_dplr._fused_out_bwd(do, q, k, v, b, w, U, M_in, 0.3, geometry)
    rows = (q, w, do, 0.3)
    dUv, dWy, dBe, dKe, dVe, dD = triton_dplr._scan_bwd(dU, None, Wy, Be, Ke, v, D, U, M_in, tiles, H, rows, True)
    assert dWy.shape[0] == dD.shape[0] == 3

    def grads(dWy, dBe, dKe, dD):  # prep_bwd's (dk, dv, da, db, dw), the one value block's gradients
        dk, dv, da, db, dw = triton_dplr._fused_prep_bwd(
            k, v, a, b, w, Tm, dUv, dWy, dBe, dKe, dVe, dD, *out_shares, geometry
        )
        return dk[0], dv, da[0], db[0], dw[0]

    got = grads(dWy, dBe, dKe, dD)
    want = grads(*(x.sum(0, keepdim=True) for x in (dWy, dBe, dKe, dD)))
    assert all(rel(g, x) < 1e-6 for g, x in zip(got, want)), [rel(g, x) for g, x in zip(got, want)]
    first = grads(*(x[:1] for x in (dWy, dBe, dKe, dD)))
    assert rel(first[0], want[0]) > 1e-3


def test_fused_chunk_sizes():
    """The fused kernels run chunks of 16 by default, or 32 / 64 asked for, within the bound's factored chunk;
    not 64 at keys wider than 64; without a bound, or where the bound allows fewer steps, they do not run."""
    fc = triton_dplr.fused_chunk
    assert fc(64, RWKV7_BOUND, None) == 16 and fc(128, RWKV7_BOUND, None) == 16
    assert fc(64, RWKV7_BOUND, 64) == 64 and fc(128, RWKV7_BOUND, 64) is None
    assert fc(128, RWKV7_BOUND, 32) == 32 and fc(16, -1.0, 32) == 32 and fc(16, -1.0, 64) is None
    assert fc(16, -3.0, None) is None and fc(16, None, None) is None and fc(16, RWKV7_BOUND, 48) is None


def test_through_the_entry_point_with_bfloat16_inputs():
    """``dplr_delta_rule(..., backend="triton_chunk")`` passes the bound on; bfloat16 inputs compute in float32
    and return bfloat16: within bfloat16's rounding."""
    xs = _dplr_inputs(1, 70, 2, 16, 16, seed=3, decay=-RWKV7_BOUND)
    fast = [x.to(DEVICE, torch.bfloat16) for x in xs]
    o = kd.dplr_delta_rule(*fast, lower_bound=RWKV7_BOUND, backend="triton_chunk")
    want = kd.dplr_delta_rule(*(x.double() for x in fast), backend="reference")
    assert o.dtype == torch.bfloat16 and rel(o, want) < 1e-2


@pytest.mark.parametrize("V,tiles", [(16, None), (40, ScanTiles(block_v=16))])
def test_fused_gradients_in_the_inputs_dtypes(V, tiles):
    """bfloat16 inputs with float32 decays: each gradient comes back in its input's dtype, within bfloat16's
    rounding of the float64 loop's, from one value block (the kernels store that dtype) and from three (their
    float32 shares summed, then cast); the backward fills no zero gradients for the forward's saved outputs."""
    from torch.profiler import ProfilerActivity, profile

    xs = _dplr_inputs(1, 37, 2, 16, V, seed=V, decay=-RWKV7_BOUND)
    fast = [
        x.detach().to(DEVICE, torch.float32 if i == 5 else torch.bfloat16).requires_grad_() for i, x in enumerate(xs)
    ]
    o = triton_dplr.dplr_delta_rule(*fast, lower_bound=RWKV7_BOUND, tiles=tiles)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    do_fast = do.to(DEVICE, o.dtype)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        got = torch.autograd.grad(o, fast, do_fast)
    exact = [x.detach().double().requires_grad_() for x in fast]
    want = torch.autograd.grad(kc.dplr_delta_rule(*exact, lower_bound=RWKV7_BOUND), exact, do.to(exact[0].device))
    assert [g.dtype for g in got] == [x.dtype for x in fast]
    assert all(rel(g, wg) < 2e-2 for g, wg in zip(got, want)), [rel(g, wg) for g, wg in zip(got, want)]
    ran = [e.name for e in prof.events()]
    assert not set(ran) & {"aten::zeros", "aten::zeros_like", "aten::zero_"}
    assert tiles is not None or "aten::_to_copy" not in ran  # one value block: no casts after the kernels


def test_custom_ops_opcheck_autograd_and_compile():
    """The scan ops' and the fused ops' registration (schema, fake tensors) is consistent; the scan's
    registered autograd gives the eager path's gradients exactly; under ``torch.compile`` (fullgraph) the rule
    reaches ``expressivity::dplr_chunk_fwd`` (RWKV-7's bound) and ``expressivity::dplr_scan_fwd`` (no bound)
    with the eager gradients."""
    xs = [x.float().to(DEVICE) for x in _scan_inputs((2,), 3, 16, 16, 16, seed=0)]
    torch.library.opcheck(dplr_scan_fwd, xs, test_utils=("test_schema", "test_faketensor"))
    U, M = dplr_scan_fwd(*xs)
    bwd_args = (torch.randn_like(U), torch.randn_like(M), *xs[1:], U, M)
    torch.library.opcheck(dplr_scan_bwd, bwd_args, test_utils=("test_schema", "test_faketensor"))
    leaves = [x.clone().requires_grad_() for x in xs]
    op = torch.autograd.grad(sum(t.sum() for t in dplr_scan_fwd(*leaves)), leaves)
    eager = torch.autograd.grad(sum(t.sum() for t in triton_dplr.dplr_scan(*leaves, tiles=ScanTiles())), leaves)
    for a, b in zip(op, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    graphs = []

    def record(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    rule = [x.float().to(DEVICE).requires_grad_() for x in _dplr_inputs(1, 40, 2, 16, 16, seed=4, decay=0.6)]
    torch.library.opcheck(triton_dplr.dplr_chunk_fwd, (*rule, 0.5, 32), test_utils=("test_schema", "test_faketensor"))
    o, *saved = triton_dplr.dplr_chunk_fwd(*rule, 0.5, 32)
    assert len(saved) == len(triton_dplr.SAVED)
    torch.library.opcheck(
        triton_dplr.dplr_chunk_bwd,
        (torch.randn_like(o), *(x.detach() for x in (*rule, *saved)), 0.5, 32),
        test_utils=("test_schema", "test_faketensor"),
    )
    do = torch.randn(1, 40, 2, 16, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    for bound, op in ((RWKV7_BOUND, "expressivity.dplr_chunk_fwd"), (None, "expressivity.dplr_scan_fwd")):
        f = lambda *x, bound=bound: kd.dplr_delta_rule(*x, lower_bound=bound, backend="triton_chunk")  # noqa: E731
        want = torch.autograd.grad(f(*rule), rule, do)
        graphs.clear()
        got = torch.autograd.grad(torch.compile(f, fullgraph=True, backend=record)(*rule), rule, do)
        assert len(graphs) == 1 and op in graphs[0]
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_bad_tiles_and_inputs_are_one_line_errors():
    for tiles, match in (
        (ScanTiles(block_v=24), "block_v must be a power of two in \\[16, 32\\], got 24"),
        (ScanTiles(block_v=64), "block_v must be a power of two in \\[16, 32\\], got 64"),
        (ScanTiles(warps=3), "warps must be 1, 2, 4, 8 or 16, got 3"),
        (ScanTiles(chunk_warps=32), "chunk_warps must be 1, 2, 4, 8 or 16, got 32"),
        (ScanTiles(chunk_block_v=48), "chunk_block_v must be a power of two in \\[16, 32\\], got 48"),
        (ScanTiles(chunk_block_v=64), "chunk_block_v must be a power of two in \\[16, 32\\], got 64"),
        (ScanTiles(stages=0), "stages must be 1 to 6, got 0"),
        (ScanTiles(precision="fp8"), "precision must be one of"),
        (ScanTiles(block_v=16, warps=8), "block_v 16 takes at most 4 warps with tf32x3 products, got 8"),
        (ScanTiles(block_v=16, warps=16, precision="tf32"), "block_v 16 takes at most 4 warps with tf32 products"),
    ):
        with pytest.raises(ValueError, match=match):
            tiles.resolve(16, 16, 20)
    assert ScanTiles().resolve(64, 128, 128) == (128, 16, 4, "tf32x3") and ScanTiles().resolve(16, 128, 100)[1] == 32
    assert ScanTiles().resolve(64, 64, 100)[1] == 64 and ScanTiles().resolve(33, 128, 40)[1] == 16
    # the scan's backward at 8 warps where its value blocks hold 32 columns or more at chunks of up to 16 steps;
    # its loop pipelined at those chunks; the fused kernels at 2 warps at chunks of 16 and keys up to 64 wide
    assert [ScanTiles().resolve(16, K, K, backward=True)[2] for K in (16, 64, 128)] == [4, 8, 8]
    assert ScanTiles().resolve(64, 128, 128, backward=True)[2] == 4 and ScanTiles().resolve(16, 64, 64)[2] == 4
    assert ScanTiles().resolve(32, 64, 64, backward=True)[2] == 4
    W = torch.empty(1, 1, 64, 128)
    assert [triton_dplr._meta(W[..., :C, :], 64, None)[1]["num_stages"] for C in (16, 5, 32)] == [3, 3, 1]
    explicit = triton_dplr._meta(W, 64, ScanTiles(stages=2, warps=2), backward=True)[1]
    assert (explicit["num_stages"], explicit["num_warps"]) == (2, 2)

    def chunk_warps(K, C=16, **kw):
        return triton_dplr._chunk_meta(W[..., :K], W, C, ScanTiles(**kw))[-1]["num_warps"]

    assert [chunk_warps(K) for K in (16, 64, 65, 128)] == [2, 2, 4, 4] and chunk_warps(64, chunk_warps=8) == 8
    assert chunk_warps(64, C=32) == 4
    q = torch.zeros(1, 3, 1, 4, dtype=torch.int32, device=DEVICE)
    with pytest.raises(TypeError, match="dplr triton_chunk: inputs must be one of"):
        triton_dplr.dplr_delta_rule(q, q, q, q, q, q)


def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(test))


@pytest.mark.parametrize("L", [1, 67, 130, 1024])
@pytest.mark.parametrize("D", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("lower_bound", [RWKV7_BOUND, None])
@gpu
def test_gpu_triton_chunk_equals_reference(L, D, dtype, tol, lower_bound):
    """Lengths 1 to 1,024, head dims 16 to 128, factored (RWKV-7's bound) and pairwise decays."""
    B, H = (2, 3) if L <= 130 else (1, 2)
    _compare((B, L, H, D, D), dtype, tol, lower_bound, seed=L + D)


@pytest.mark.parametrize(
    "D,tiles",
    [
        (128, ScanTiles(block_v=16, warps=2)),
        (128, ScanTiles(block_v=32, precision="ieee")),  # 32 columns fit shared memory at chunks of 64 with ieee
        (128, ScanTiles(block_v=16, warps=8, precision="ieee")),
        (64, ScanTiles(block_v=32, warps=8)),
        (64, ScanTiles(block_v=64, warps=8)),
    ],
)
@gpu
def test_gpu_scan_tiles(D, tiles):
    _compare((2, 300, 2, D, D), torch.float32, 1e-4, RWKV7_BOUND, tiles=tiles, seed=5)


@pytest.mark.parametrize("chunk", [16, 32, 64])
@pytest.mark.parametrize("precision,tol", [("tf32x3", 1e-4), ("tf32", 1e-2), ("ieee", 1e-4), ("bf16", 3e-2)])
@gpu
def test_gpu_fused_chunk_sizes_and_precisions(chunk, precision, tol):
    """The fused kernels at each chunk size and product precision, head dim 64, a partial last chunk."""
    _compare((2, 300, 2, 64, 64), torch.float32, tol, RWKV7_BOUND, chunk, ScanTiles(precision=precision), seed=7)


@gpu
def test_gpu_triton_chunk_in_a_cuda_graph(graph_grads):
    """Forward and backward captured in one CUDA graph replay what an eager call computes."""
    xs = [x.float().cuda().requires_grad_() for x in _dplr_inputs(8, 100, 4, 32, 32, seed=1, decay=0.6)]
    f = lambda *x: kd.dplr_delta_rule(*x, lower_bound=RWKV7_BOUND, backend="triton_chunk")  # noqa: E731
    do = torch.randn(8, 100, 4, 32, device="cuda")
    eager = torch.autograd.grad(f(*xs), xs, do)
    for a, b in zip(graph_grads(f, xs, do), eager):
        assert torch.allclose(a, b, rtol=0, atol=0)
