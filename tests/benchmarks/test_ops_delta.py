"""``benchmarks.ops.delta``'s implementations compute the op they are timed as: each of ours on the same
small inputs equals the PyTorch chunk form (the kernels in the interpreter on the CPU), and
``--chunk-tiles`` parses every ``ChunkTiles`` field, refusing unknown ones."""

from __future__ import annotations

import pytest
import torch

from benchmarks.ops.delta import chunk_tiles, implementations, inputs
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


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA (the interpreter's bfloat16 tl.dot is not faithful)"
)
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
    text = "chunk=32,warps=8,block_v=16,stages=3,precision=ieee,inverse=rows,store=bf16"
    assert chunk_tiles(text) == ChunkTiles(
        chunk=32, warps=8, block_v=16, stages=3, precision="ieee", inverse="rows", store="bf16"
    )
    assert chunk_tiles(None) == ChunkTiles()
    with pytest.raises(SystemExit, match="unknown field 'fused'"):
        chunk_tiles("fused=1")
    with pytest.raises(SystemExit, match="chunk must be a positive int"):
        chunk_tiles("chunk=big")
