"""The delta family's chunkwise Triton kernels (``backend="triton_chunk"``: ``seqkernels/delta/chunk_kernels.py``,
host code in ``triton_chunk.py``) against the float64 per-token references (themselves checked against dense
transition matrices in ``test_delta.py``): the output and every input gradient of the delta rule, the
gated delta rule and DeltaProduct (3 Householder steps per token, with and without decay), at lengths that leave a partial last chunk, several chunks, key and value widths that are
not powers of two and several blocks of value columns, with the outputs and gradients computed in per-chunk
kernels from stored states (the default) and in the sequential kernels (state on chip, ``ChunkTiles(fused=True)``),
``I + A`` inverted by 16 x 16 blocks, the diagonal ones together (the default), and row by row
(``ChunkTiles(inverse="rows")``); outputs and intermediates poisoned with NaN; the
custom ops under ``opcheck`` and through their registered autograd. On the CPU the kernels run in the
interpreter at small shapes; on a GPU (``-m gpu``) compiled, at lengths up to 1,024 and head dims 16 to 128,
in float32 and bfloat16, captured in a CUDA graph and under ``torch.compile``.
"""

import pytest
import torch
import torch.nn.functional as F

from seqkernels import delta as kd
from seqkernels._triton import poisoned, triton_available
from seqkernels.delta import triton_chunk
from seqkernels.delta.triton_chunk import ChunkTiles, delta_chunk_bwd, delta_chunk_fwd

F64 = torch.float64
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not triton_available(torch.empty(0, device=DEVICE)), reason="needs CUDA or TRITON_INTERPRET=1"
)
MEMBERS = ["delta_rule", "gated_delta_rule", "delta_product", "gated_delta_product"]


def _inputs(member, B, L, H, K, V, seed, n=3):
    """Random inputs like the mixers' (beta in [0, 2], log decays in [-1, 0]); the delta rule with keys
    of norm 3 and ``qk_l2norm``, the others with unit keys and no normalisation; ``n`` Householder steps."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
    u = lambda *s: torch.rand(*s, generator=gen, dtype=F64)  # noqa: E731
    q, k, v, beta = r(B, L, H, K), F.normalize(r(B, L, H, K), dim=-1), r(B, L, H, V), 2 * u(B, L, H)
    kn, vn, bn = F.normalize(r(B, L, n, H, K), dim=-1), r(B, L, n, H, V), 2 * u(B, L, n, H)
    return {
        "delta_rule": ([q, 3 * k, v, beta], {"qk_l2norm": True}),
        "gated_delta_rule": ([q, k, v, -u(B, L, H), beta], {}),
        "delta_product": ([q, kn, vn, bn], {}),
        "gated_delta_product": ([q, kn, vn, bn, -u(B, L, H)], {}),
    }[member]


def _run(member, xs, kw, backend, tiles=None):
    name = "delta_product" if member == "gated_delta_product" else member
    if tiles is not None:  # explicit tiles: the member's function in triton_chunk.py
        return getattr(triton_chunk, name)(*xs, tiles=tiles, **kw)
    return getattr(kd, name)(*xs, backend=backend, **kw)


def rel(x, y, floor=0.0):
    x, y = x.detach().double(), y.detach().double()
    return float((x - y).norm() / max(float(y.norm()), floor, 1e-30))


def compare_with_reference(fast_fn, ref_fn, tensors, dtype, tol, do_seed):
    """``fast_fn`` on ``dtype`` copies of ``tensors`` (its kernel outputs poisoned with NaN) against ``ref_fn``
    on float64 copies: output and every gradient for one random output gradient (``do_seed``), errors
    relative to the norm of the reference, gradients to at least 1% of the largest gradient's; each at most
    ``tol`` (a NaN fails). Returns the errors by name."""
    fast = [t.to(DEVICE, dtype).requires_grad_() for t in tensors]
    slow = [t.to(DEVICE, F64).requires_grad_() for t in tensors]
    with poisoned():
        o_fast = fast_fn(*fast)
    o_ref = ref_fn(*slow)
    do = torch.randn(o_ref.shape, generator=torch.Generator().manual_seed(do_seed), dtype=F64).to(DEVICE)
    with poisoned():
        g_fast = torch.autograd.grad(o_fast, fast, do.to(dtype))
    g_ref = torch.autograd.grad(o_ref, slow, do)
    assert o_fast.dtype == dtype and all(g.dtype == dtype for g in g_fast)
    floor = 1e-2 * max(float(b.norm()) for b in g_ref)
    errors = {"out": rel(o_fast, o_ref), **{f"d{i}": rel(a, b, floor) for i, (a, b) in enumerate(zip(g_fast, g_ref))}}
    assert all(e <= tol for e in errors.values()), errors  # a NaN error fails (max() would skip it)
    return errors


def _compare(member, shape, dtype, tol, tiles=None, seed=0):
    """``triton_chunk`` against the reference (``compare_with_reference``)."""
    tensors, kw = _inputs(member, *shape, seed=seed)
    fast = lambda *xs: _run(member, xs, kw, "triton_chunk", tiles)  # noqa: E731
    return compare_with_reference(fast, lambda *xs: _run(member, xs, kw, "reference"), tensors, dtype, tol, seed + 1)


@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize(
    "shape,tiles",
    [
        ((2, 1, 1, 16, 16), None),  # one token: a single, mostly padded chunk of 16
        ((1, 37, 2, 16, 16), ChunkTiles(chunk=16)),  # several chunks, the last one partial; one diagonal block
        ((1, 130, 2, 32, 32), ChunkTiles(chunk=32)),  # several chunks, a few steps in the last
        ((1, 67, 1, 20, 40), ChunkTiles(chunk=16, block_v=16)),  # K, V not powers of two; 4 value blocks
        ((1, 70, 1, 80, 72), ChunkTiles(chunk=32)),  # keys, values in 2 blocks in the prep backward, 4 in grads
        ((1, 37, 1, 80, 72), ChunkTiles(chunk=64)),  # chunks of 64: keys, values in 2 blocks in the prep backward
        ((1, 130, 1, 16, 32), None),  # the default chunk of 32
        ((1, 37, 2, 16, 16), ChunkTiles(chunk=16, fused=True)),  # outputs and gradients with the state on chip
        ((1, 67, 1, 20, 40), ChunkTiles(chunk=16, block_v=16, fused=True)),
        ((1, 130, 1, 16, 32), ChunkTiles(chunk=64)),  # I + A inverted by 16 x 16 blocks, 4 per chunk
        ((1, 130, 1, 16, 32), ChunkTiles(inverse="rows")),  # I + A inverted row by row
        ((1, 37, 2, 16, 16), ChunkTiles(chunk=64, inverse="rows")),
        ((1, 37, 2, 16, 16), ChunkTiles(chunk=16, bwd_warps=8)),  # the backward launched with its own warps
    ],
)
def test_triton_chunk_equals_reference(member, shape, tiles):
    _compare(member, shape, torch.float32, 1e-5, tiles, seed=shape[1] + shape[3])


def test_triton_chunk_bfloat16_inputs():
    """bfloat16 storage, float32 arithmetic: about bfloat16's rounding of the inputs."""
    _compare("gated_delta_rule", (1, 45, 2, 16, 16), torch.bfloat16, 3e-2, ChunkTiles(chunk=16))


def test_triton_chunk_bfloat16_intermediates():
    """``W``, ``U'``, the stored states and their gradients kept in bfloat16 between kernels
    (``ChunkTiles(store="bf16")``, the default with bfloat16 products) at float32 products: within
    bfloat16's rounding, with the kept tensors in bfloat16 and ``T`` in float32."""
    errors = _compare(
        "gated_delta_product", (1, 45, 2, 16, 24), torch.float32, 3e-2, ChunkTiles(chunk=16, store="bf16")
    )
    assert max(errors.values()) > 1e-5  # the rounding is there: float32 intermediates give 1e-6
    tensors, _ = _inputs("gated_delta_rule", 1, 20, 1, 16, 16, seed=2)
    q, k, v, g, beta = (t.float().to(DEVICE) for t in tensors)
    for tiles, kept in ((ChunkTiles(store="bf16"), torch.bfloat16), (ChunkTiles(), torch.float32)):
        _, W, U, Tm, ckpt = triton_chunk._forward(q, k, v, g, beta, 0.25, 1, save=True, tiles=tiles)
        assert (W.dtype, U.dtype, ckpt.dtype, Tm.dtype) == (kept, kept, kept, torch.float32)
    assert ChunkTiles(precision="bf16").store_dtype("bf16") == torch.bfloat16
    assert ChunkTiles(precision="bf16", store="fp32").store_dtype("bf16") == torch.float32


@pytest.mark.parametrize(
    "member,shape,tiles",
    [
        ("gated_delta_rule", (1, 70, 2, 64, 64), ChunkTiles(precision="bf16")),  # chunks of 64, bf16 kept
        ("gated_delta_rule", (1, 70, 1, 128, 128), ChunkTiles(precision="bf16")),  # two value blocks
        ("delta_rule", (1, 70, 1, 128, 32), ChunkTiles(precision="bf16")),  # one value block of 32: chunks of 32
        ("gated_delta_rule", (1, 70, 2, 32, 32), ChunkTiles(chunk=64, precision="bf16")),  # below 64: 8 warps
        ("gated_delta_rule", (1, 45, 1, 40, 24), ChunkTiles(precision="bf16", store="fp32", chunk=16)),
        ("gated_delta_product", (1, 37, 1, 32, 32), ChunkTiles(precision="bf16", block_v=16)),
        ("delta_rule", (1, 37, 1, 32, 32), ChunkTiles(precision="bf16", fused=True)),
    ],
)
def test_triton_chunk_bf16_products(member, shape, tiles):
    """``precision="bf16"`` products (operands rounded to bfloat16; under the interpreter multiplied in
    float32, ``chunk_kernels.INTERPRETED``) at small shapes: within bfloat16's rounding of the reference,
    but not float32-exact."""
    errors = _compare(member, shape, torch.float32, 5e-2, tiles, seed=shape[1] + shape[3])
    assert max(errors.values()) > 1e-4


def test_custom_ops_opcheck_and_autograd():
    """The custom ops' registration (schema, fake tensors) is consistent, and their registered autograd gives
    the eager path's gradients (the path ``torch.compile`` takes); one step per token without decay, and
    two steps per token with it, its output (and the gradient read back) in bfloat16."""
    gen = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen).to(DEVICE)  # noqa: E731
    B, L, H, K, V = 1, 21, 2, 16, 16
    for n, gated, precision in ((1, False, "tf32x3"), (2, True, "bf16")):  # bf16: intermediates in bfloat16
        q, k, v = r(B, L, H, K), F.normalize(r(B, L * n, H, K), dim=-1), r(B, L * n, H, V)
        g, beta = -torch.rand(B, L * n, H).to(DEVICE) if gated else None, torch.rand(B, L * n, H).to(DEVICE)
        inputs = [None if x is None else x.requires_grad_() for x in (q, k, v, g, beta)]
        out = torch.bfloat16 if gated else torch.float32
        args = (*inputs, 0.5, n, precision, out)
        torch.library.opcheck(delta_chunk_fwd, args, test_utils=("test_schema", "test_faketensor"))
        leaves = [x for x in inputs if x is not None]
        do = r(B, L, H, V).to(out)
        saved = [None if x is None else x.detach() for x in (q, k, v, g, beta)]
        bwd_args = (do, *saved, *(x.detach() for x in delta_chunk_fwd(*args)[1:]), 0.5, n, precision)
        torch.library.opcheck(delta_chunk_bwd, bwd_args, test_utils=("test_schema", "test_faketensor"))
        o = delta_chunk_fwd(*args)[0]
        assert o.dtype == out
        op_grads = torch.autograd.grad(o, leaves, do)
        tiles = ChunkTiles(precision=precision)
        eager = triton_chunk.gated_delta_chunk(*inputs, scale=0.5, nstep=n, tiles=tiles, input_dtype=out)
        torch.testing.assert_close(o, eager, rtol=0, atol=0)
        for a, b in zip(op_grads, torch.autograd.grad(eager, leaves, do)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_torch_compile_takes_the_custom_ops():
    """Under ``torch.compile`` (fullgraph) the dispatch reaches ``expressivity::delta_chunk_fwd`` and the
    gradients through its registered autograd equal the eager path's."""
    tensors, kw = _inputs("gated_delta_rule", 2, 40, 2, 16, 16, seed=3)
    xs = [t.float().to(DEVICE).requires_grad_() for t in tensors]
    do = torch.randn(2, 40, 2, 16, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    graphs = []

    def record(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    f = lambda *x: kd.gated_delta_rule(*x, backend="triton_chunk")  # noqa: E731
    eager = torch.autograd.grad(f(*xs), xs, do)
    compiled = torch.autograd.grad(torch.compile(f, fullgraph=True, backend=record)(*xs), xs, do)
    assert len(graphs) == 1 and "expressivity.delta_chunk_fwd" in graphs[0]
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype,want", [(torch.float32, "tf32x3"), (torch.bfloat16, "tf32"), (torch.float64, "tf32x3")])
def test_default_precision_follows_the_callers_inputs(monkeypatch, dtype, want):
    """``qk_l2norm`` hands the kernels float32 ``q``, ``k`` whatever the inputs' dtype; the products' default
    precision follows the caller's inputs, on the eager path and through the custom op ``torch.compile``
    reaches; explicit tiles keep theirs."""
    seen, launch = [], triton_chunk._forward
    monkeypatch.setattr(
        triton_chunk, "_forward", lambda *a, tiles, **kw: seen.append(tiles.precision) or launch(*a, tiles=tiles, **kw)
    )
    tensors, kw = _inputs("delta_rule", 1, 20, 2, 16, 16, seed=6)
    xs = [t.to(DEVICE, dtype) for t in tensors]
    f = lambda *x: kd.delta_rule(*x, backend="triton_chunk", **kw)  # noqa: E731
    f(*xs)
    torch.compile(f, fullgraph=True, backend=lambda gm, _: gm.forward)(*xs)
    triton_chunk.delta_rule(*xs, tiles=ChunkTiles(precision="ieee"), **kw)
    assert seen == [want, want, "ieee"]


def test_bad_tiles_and_inputs_are_one_line_errors():
    q = torch.randn(1, 3, 1, 16)
    beta = torch.rand(1, 3, 1)
    with pytest.raises(ValueError, match="chunk must be 16, 32 or 64, got 8"):
        triton_chunk.delta_rule(q, q, q, beta, tiles=ChunkTiles(chunk=8))
    with pytest.raises(ValueError, match=r"block_v must be a power of two in \[16, 16\], got 32"):
        triton_chunk.delta_rule(q, q, q, beta, tiles=ChunkTiles(block_v=32))
    with pytest.raises(ValueError, match="precision must be one of"):
        triton_chunk.delta_rule(q, q, q, beta, tiles=ChunkTiles(precision="fp16"))
    with pytest.raises(ValueError, match=r"inverse must be one of \('stacked', 'rows'\), got 'lu'"):
        triton_chunk.delta_rule(q, q, q, beta, tiles=ChunkTiles(inverse="lu"))
    with pytest.raises(ValueError, match="chunk 64 with bf16 products at head dims below 64 needs 8 warps, got 4"):
        triton_chunk.delta_rule(q, q, q, beta, tiles=ChunkTiles(chunk=64, precision="bf16", warps=4))
    q128 = torch.randn(1, 3, 1, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="chunk 64 at head dims above 64 with 'tf32' products needs more shared"):
        triton_chunk.delta_rule(q128, q128, q128, beta.bfloat16(), tiles=ChunkTiles(chunk=64))
    with pytest.raises(ValueError, match="store must be 'fp32' or 'bf16', got 'fp16'"):
        triton_chunk.delta_rule(q, q, q, beta, tiles=ChunkTiles(store="fp16"))
    with pytest.raises(ValueError, match="stages must be a positive int, got 0"):
        triton_chunk.delta_rule(q, q, q, beta, tiles=ChunkTiles(stages=0))
    wide = torch.randn(1, 3, 1, 160)
    with pytest.raises(ValueError, match="head dims up to 128, got K=160"):
        triton_chunk.delta_rule(wide, wide, q, beta)


def test_default_warps_follow_the_head_width():
    """2 warps for heads 16 wide, else 4, but 8 for the gradient kernel above 64; 8 for chunks of 64 with bf16
    products below 64; the backward's as the forward's unless set, the gradient kernel's as the backward's."""
    warps = lambda D, **kw: ChunkTiles(**kw).resolve(256, D, D, torch.float32)[4:7]  # noqa: E731
    assert [warps(D) for D in (8, 16, 32, 64, 128)] == [(2, 2, 2), (2, 2, 2), (4, 4, 4), (4, 4, 4), (4, 4, 8)]
    assert warps(32, chunk=64, precision="bf16") == (8, 8, 8) and warps(64, chunk=64, precision="bf16") == (4, 4, 4)
    assert warps(64, bwd_warps=8) == (4, 8, 8) and warps(64, warps=2) == (2, 2, 2)
    assert warps(128, warps=2) == (2, 2, 2) and warps(128, bwd_warps=4) == (4, 4, 4)
    assert warps(96, chunk=64, precision="bf16") == (4, 4, 8)
    with pytest.raises(ValueError, match="needs 8 bwd_warps, got 4"):
        warps(32, chunk=64, precision="bf16", bwd_warps=4)
    with pytest.raises(ValueError, match="bwd_warps must be 1, 2, 4, 8 or 16, got 3"):
        warps(32, bwd_warps=3)
    with pytest.raises(ValueError, match="grads_warps must be 1, 2, 4, 8 or 16, got 5"):
        warps(128, grads_warps=5)
    # the configurations that faulted on an H100 (chunk 64, bf16 products, head dim 128) are refused
    bf16_64 = {"chunk": 64, "precision": "bf16"}
    with pytest.raises(ValueError, match="refuses 16 warps"):
        warps(128, bwd_warps=16, **bf16_64)
    assert warps(128, grads_warps=16) == (4, 4, 16) and warps(64, warps=16, **bf16_64) == (16, 16, 16)


def test_value_blocks_narrower_than_64_refused_at_chunk_64_with_bf16_products():
    """Value blocks below 64 columns faulted or gave wrong outputs on an H100 at chunks of 64 with bf16
    products at head dims 64 and 128, whether they split the values (V 64, 128) or held them all (K 128,
    V 32): refused there, at any warps and stages; the default chunk there is 32; kept at chunks of 32 and
    with other products."""
    resolve = lambda K, V, **kw: ChunkTiles(**kw).resolve(256, K, V, torch.float32)  # noqa: E731
    bf16_64 = {"chunk": 64, "precision": "bf16"}
    for K, V, bv in ((128, 128, 32), (128, 128, 16), (64, 64, 32), (64, 64, 16), (128, 32, None), (64, 16, None)):
        for extra in ({}, {"warps": 8}, {"stages": 2}, {"store": "fp32"}):
            with pytest.raises(ValueError, match=r"block_v \d+ at chunk 64 with bf16 products at head dims of 64"):
                resolve(K, V, block_v=bv, **bf16_64, **extra)
    assert resolve(64, 64, block_v=32, chunk=32, precision="bf16")[2] == 32
    assert resolve(64, 64, block_v=32, chunk=64, precision="tf32x3")[2] == 32
    assert resolve(128, 128, **bf16_64)[2] == 64
    # by default: chunks of 64 only with value blocks of 64
    assert resolve(128, 128, precision="bf16")[:3] == (64, 128, 64)
    assert resolve(128, 32, precision="bf16")[:3] == (32, 128, 32)
    assert resolve(128, 128, block_v=32, precision="bf16")[:3] == (32, 128, 32)


def test_default_stages_follow_the_products_and_the_head_width():
    """Pipelining depth 2 everywhere, but with bf16 products above head dim 64 the backward's split walk
    takes 1 and the gradient kernel 4 (float32 operands at 4 stages need more shared memory than an
    H100 has), and with float32 operands over chunks of 64 above head dim 64 the walk takes 1; ``stages``
    set applies to every kernel."""
    assert ChunkTiles().kernel_stages(128, "bf16", 64) == ChunkTiles().kernel_stages(128, "bf16", 32) == (2, 1, 4)
    assert ChunkTiles().kernel_stages(64, "bf16", 64) == ChunkTiles().kernel_stages(128, "tf32x3", 32) == (2, 2, 2)
    assert ChunkTiles(stages=3).kernel_stages(128, "bf16", 64) == (3, 3, 3)
    # float32 operands over chunks of 64 above head dim 64: the walk at 2 stages needs 240 KiB of shared memory
    assert ChunkTiles().kernel_stages(128, "tf32x3", 64) == ChunkTiles().kernel_stages(128, "ieee", 64) == (2, 1, 2)
    assert ChunkTiles().kernel_stages(64, "tf32x3", 64) == (2, 2, 2)
    q, k, v = (torch.zeros(1, 256, 1, 128, dtype=torch.bfloat16) for _ in range(3))
    *_, blocks, own = triton_chunk._meta(q, k, v, None, 1, ChunkTiles(precision="bf16"), backward=True)
    assert (blocks["num_stages"], own["walk"]["num_stages"], own["grads"]["num_stages"]) == (2, 1, 4)
    assert (blocks["num_warps"], own["walk"]["num_warps"], own["grads"]["num_warps"]) == (4, 4, 8)


def test_default_chunk_follows_the_products_and_the_head_width():
    """64 for bf16 products at head widths 64 and 128 from 64 steps on, else 32 (less for shorter sequences)."""

    def chunk(T, D, precision=None, dtype=torch.float32):
        return ChunkTiles(precision=precision).resolve(T, D, D, dtype)[0]

    assert chunk(256, 64, "bf16") == 64 and chunk(256, 48, "bf16") == 64 and chunk(63, 64, "bf16") == 32
    assert chunk(256, 64) == chunk(256, 64, "tf32", torch.bfloat16) == 32
    assert chunk(256, 128, "bf16", torch.bfloat16) == chunk(256, 96, "bf16") == 64 and chunk(63, 128, "bf16") == 32
    assert chunk(256, 32, "bf16") == chunk(256, 128, "tf32", torch.bfloat16) == 32 and chunk(5, 64) == 16


@pytest.mark.parametrize(
    "precision,fused,ok",
    [
        ("tf32", False, False),
        ("tf32x3", True, False),
        ("tf32x3", False, True),
        ("bf16", True, True),
        ("ieee", True, True),
    ],
)
def test_chunks_of_64_at_head_dim_128_only_where_shared_memory_holds(precision, fused, ok):
    """The precisions whose kernels need more shared memory than an H100 has at chunks of 64 and head dim
    128 (the compile report's ``smem``) are refused; the rest resolve."""
    tiles = ChunkTiles(chunk=64, precision=precision, fused=fused)
    if ok:
        assert (
            tiles.resolve(256, 128, 128, torch.float32)[0] == 64 and tiles.resolve(256, 64, 64, torch.float32)[0] == 64
        )
    else:
        with pytest.raises(ValueError, match=f"chunk 64 at head dims above 64 with '{precision}' products"):
            tiles.resolve(256, 128, 128, torch.float32)
        assert tiles.resolve(256, 64, 64, torch.float32)[0] == 64  # head dim 64 is not affected


def test_triton_chunk_named_on_cpu_without_interpreter_is_one_line(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.randn(1, 2, 1, 4)
    if torch.cuda.is_available():
        pytest.skip("CPU tensors on a GPU machine: covered elsewhere")
    with pytest.raises(ValueError, match="backend 'triton_chunk' needs CUDA tensors"):
        kd.gated_delta_rule(q, q, q, q[..., 0], q[..., 0], backend="triton_chunk")


# ---------------------------------------------------------------------------------------------- GPU


def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(test))


@pytest.mark.parametrize("member", ["delta_rule", "gated_delta_rule"])
@pytest.mark.parametrize("L", [1, 67, 130, 1024])
@pytest.mark.parametrize("D", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@gpu
def test_gpu_triton_chunk_equals_reference(member, L, D, dtype, tol):
    """Lengths 1 to 1,024 (none a multiple of the chunk but 1,024), head dims 16 to 128."""
    B, H = (2, 3) if L <= 130 else (1, 2)
    _compare(member, (B, L, H, D, D), dtype, tol, seed=L + D)


@pytest.mark.parametrize("member", ["delta_product", "gated_delta_product"])
@pytest.mark.parametrize("L", [1, 67, 1024])
@pytest.mark.parametrize("D", [16, 128])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@gpu
def test_gpu_triton_chunk_product_equals_reference(member, L, D, dtype, tol):
    """DeltaProduct, 3 steps per token: chunks that split tokens, up to 3,072 steps."""
    B, H = (2, 3) if L <= 130 else (1, 2)
    _compare(member, (B, L, H, D, D), dtype, tol, seed=L + D)


@pytest.mark.parametrize(
    "tiles",
    [
        ChunkTiles(chunk=16),
        ChunkTiles(chunk=64),
        ChunkTiles(block_v=32),
        ChunkTiles(precision="ieee"),
        ChunkTiles(fused=True),
        ChunkTiles(bwd_warps=4),
        ChunkTiles(warps=4, bwd_warps=16),
    ],
)
@gpu
def test_gpu_triton_chunk_tiles(tiles):
    """Another chunk size, several value blocks at D 128, IEEE products, the outputs and gradients
    computed with the state on chip (paper 004) and the backward at other warps than the forward, float32."""
    _compare("gated_delta_rule", (2, 300, 2, 128, 128), torch.float32, 1e-4, tiles, seed=5)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("L,D", [(1, 16), (67, 64), (1024, 64), (130, 128)])
@pytest.mark.parametrize("inverse,chunk", [("rows", None), ("stacked", 64)])
@gpu
def test_gpu_triton_chunk_other_inverse(L, D, dtype, tol, inverse, chunk):
    """``I + A`` inverted row by row, and by blocks at chunks of 64 (4 diagonal blocks together; at head
    dim 128 bfloat16 inputs take ``"bf16"`` products there: their default ``"tf32"`` is refused); the
    gated delta rule against the reference."""
    precision = "bf16" if chunk == 64 and D > 64 and dtype == torch.bfloat16 else None
    tol = 5e-2 if precision else tol
    tiles = ChunkTiles(chunk=chunk, inverse=inverse, precision=precision)
    _compare("gated_delta_rule", (2, L, 2, D, D), dtype, tol, tiles, seed=L + D)


@pytest.mark.parametrize(
    "member,store", [("gated_delta_rule", None), ("gated_delta_rule", "fp32"), ("delta_rule", None)]
)
@gpu
def test_gpu_triton_chunk_bf16_products(member, store):
    """``precision="bf16"`` (operands rounded to bfloat16, as fla multiplies), the intermediates in bfloat16
    (its default) or float32, and (``delta_rule``: ``qk_l2norm``) q, k normalized into bfloat16: bfloat16
    inputs within 5e-2."""
    tiles = ChunkTiles(precision="bf16", store=store)
    _compare(member, (2, 300, 3, 64, 64), torch.bfloat16, 5e-2, tiles, seed=7)


@gpu
def test_gpu_triton_chunk_in_a_cuda_graph_and_compiled(graph_grads):
    """Forward and backward captured in one CUDA graph replay what an eager call computes; under
    ``torch.compile`` (the custom ops) they agree with it too."""
    tensors, kw = _inputs("gated_delta_rule", 8, 100, 4, 32, 32, seed=1)
    xs = [t.float().cuda().requires_grad_() for t in tensors]
    f = lambda *x: kd.gated_delta_rule(*x, backend="triton_chunk")  # noqa: E731
    do = torch.randn(8, 100, 4, 32, device="cuda")
    eager = torch.autograd.grad(f(*xs), xs, do)
    captured = graph_grads(f, xs, do)
    for a, b in zip(captured, eager):
        assert torch.allclose(a, b, rtol=0, atol=0)
    compiled = torch.autograd.grad(torch.compile(f, fullgraph=True)(*xs), xs, do)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
