"""``benchmarks.ops.delta``'s implementations compute the op they are timed as: each of ours on the same
small inputs equals the PyTorch chunk form (the kernels in the interpreter on the CPU), and
``--chunk-tiles`` parses every ``ChunkTiles`` field, refusing unknown ones."""

from __future__ import annotations

import pytest
import torch

from benchmarks.ops.common import kernel_lines
from benchmarks.ops.delta import chunk_kernel_bytes, chunk_tiles, implementations, inputs
from seqkernels._triton import triton_available
from seqkernels.delta.triton_chunk import ChunkTiles

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.skipif(not triton_available(torch.empty(0, device=DEVICE)), reason="needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("op", ["gated", "product"])
def test_our_implementations_equal_the_chunk_form(op):
    xs = inputs(op, 1, 37, 2, 16, torch.float32, DEVICE, seed=3)
    impls = implementations(op, {"ours-triton", "ours-triton-chunk", "ours-triton-chunk-split", "ours-triton-chunk-rows", "ours-chunk"})  # fmt: skip
    assert set(impls) == {"ours-triton", "ours-triton-chunk", "ours-triton-chunk-split", "ours-triton-chunk-rows", "ours-chunk"}  # fmt: skip
    want = impls.pop("ours-chunk")[0](*xs)
    for name, (fn, _, _) in impls.items():
        torch.testing.assert_close(fn(*xs), want, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.skipif(not triton_available(torch.empty(0, device=DEVICE)), reason="needs CUDA or TRITON_INTERPRET=1")
def test_dplr_rows_equal_the_per_token_loop():
    """``dplr``: our recurrent kernel, the PyTorch chunk form (its decays factored under RWKV-7's bound) and our
    fused chunk kernels equal the per-token loop, the latter with bfloat16 products within their rounding; none
    of the WY chunk kernels' other rows."""
    from seqkernels import delta as kd

    xs = inputs("dplr", 1, 70, 2, 16, torch.float32, DEVICE, seed=4)
    names = {"ours-triton", "ours-chunk", "ours-triton-chunk", "ours-triton-chunk-bf16", "ours-triton-chunk-split"}
    impls = implementations("dplr", names)
    assert set(impls) == names - {"ours-triton-chunk-split"}
    want = kd.dplr_delta_rule(*xs, backend="reference")
    for name, (fn, _, _) in impls.items():
        tol = dict(rtol=3e-2, atol=3e-2) if name.endswith("bf16") else dict(rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(fn(*xs), want, **tol, msg=name)


@pytest.mark.skipif(not triton_available(torch.empty(0, device=DEVICE)), reason="needs CUDA or TRITON_INTERPRET=1")
def test_the_bfloat16_row_rounds_its_products_to_bfloat16():
    """``ours-triton-chunk-bf16`` computes the op at fla's precision: near the chunk form, but not float32-exact."""
    xs = inputs("gated", 1, 300, 2, 64, torch.float32, DEVICE, seed=5)
    impls = implementations("gated", {"ours-triton-chunk-bf16", "ours-chunk"})
    got, want = impls["ours-triton-chunk-bf16"][0](*xs), impls["ours-chunk"][0](*xs)
    err = ((got - want).norm() / want.norm()).item()
    assert 1e-5 < err < 3e-2


def test_the_bfloat16_row_only_without_a_chosen_precision():
    assert "ours-triton-chunk-bf16" in implementations("gated", {"ours-triton-chunk-bf16"})
    assert "ours-triton-chunk-bf16" not in implementations("gated", tiles=ChunkTiles(precision="ieee"))


def test_chunk_tiles_parses_every_field():
    text = "chunk=32,warps=8,bwd_warps=4,grads_warps=2,block_v=16,stages=3,precision=ieee,inverse=rows,store=bf16"
    assert chunk_tiles(text) == ChunkTiles(
        chunk=32, warps=8, bwd_warps=4, grads_warps=2, block_v=16, stages=3, precision="ieee", inverse="rows",
        store="bf16",
    )  # fmt: skip
    assert chunk_tiles(None) == ChunkTiles()
    with pytest.raises(SystemExit, match="unknown field 'fused'"):
        chunk_tiles("fused=1")
    with pytest.raises(SystemExit, match="chunk must be a positive int"):
        chunk_tiles("chunk=big")


@pytest.mark.skipif(not triton_available(torch.empty(0, device=DEVICE)), reason="needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize(
    "op,v_dtype,tiles",
    [
        ("gated", torch.float32, ChunkTiles()),
        ("product", torch.bfloat16, ChunkTiles(chunk=16, store="bf16")),
        ("gated", torch.bfloat16, ChunkTiles(precision="bf16")),  # q, k normalized into bfloat16
    ],
)
def test_chunk_kernel_bytes_are_the_tensors_the_kernels_touch(op, v_dtype, tiles):
    """The forward kernels' bytes (``chunk_kernel_bytes``) against the sizes of the tensors ``triton_chunk``
    really passes them (a partial last chunk, padded widths, the output in the inputs' dtype), and the
    backward prep kernel's writes against the gradients it returns."""
    from seqkernels.delta import triton_chunk

    B, L, H, D, n = 2, 21, 2, 12, (2 if op == "product" else 1)
    gen = torch.Generator().manual_seed(0)
    qk = torch.bfloat16 if tiles.precision == "bf16" else torch.float32  # as qk_l2norm writes them
    q = torch.randn(B, L, H, D, generator=gen).to(DEVICE, qk)
    k = torch.randn(B, L * n, H, D, generator=gen).to(DEVICE, qk)
    v = torch.randn(B, L * n, H, D, generator=gen).to(DEVICE, v_dtype)
    beta = torch.rand(B, L * n, H, generator=gen).to(DEVICE)
    g = -torch.rand(B, L * n, H, generator=gen).to(DEVICE) if op == "gated" else None
    o, W, U, Tm, ckpt = triton_chunk._forward(q, k, v, g, beta, 0.3, n, save=True, tiles=tiles, out_dtype=v_dtype)
    do = torch.randn_like(o)
    dq, dk, dv, dg, dbeta = triton_chunk._backward(do, q, k, v, g, beta, W, U, Tm, ckpt, 0.3, n, tiles)
    size = lambda *xs: sum(x.nbytes for x in xs if x is not None)  # noqa: E731
    got = chunk_kernel_bytes(op, B, L, H, D, v.element_size(), tiles)
    assert got["chunk_prep_kernel"] == size(k, v, beta, g, W, U, Tm)
    assert got["chunk_fwd_kernel"] == size(k, g, W, U, U, ckpt)
    assert got["chunk_out_kernel"] == size(q, k, g, U, ckpt, o)
    reads = size(k, v, beta, g, Tm, U, dk) + W.numel() // W.shape[-1] * (W.shape[-1] + 1) * 4  # dW, dG: float32
    assert got["chunk_bwd_prep_kernel"] == reads + size(dk, dv, dbeta, g if g is None else dg)


def test_kernel_lines_show_the_limit_multiple():
    line = kernel_lines([{"kernel": "chunk_prep_kernel", "ms": 0.2, "launches": 1, "limit_ms": 0.05}])
    assert line.endswith("chunk_prep_kernel  (limit 0.0500 ms: 4.0x)")
    assert kernel_lines([{"kernel": "x", "ms": 0.2, "launches": 2}]).endswith("x2  x")
