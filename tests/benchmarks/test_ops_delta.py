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
    impls = implementations(op, {"ours-triton", "ours-triton-chunk", "ours-triton-chunk-split", "ours-triton-chunk-blocks", "ours-chunk"})  # fmt: skip
    assert set(impls) == {"ours-triton", "ours-triton-chunk", "ours-triton-chunk-split", "ours-triton-chunk-blocks", "ours-chunk"}  # fmt: skip
    want = impls.pop("ours-chunk")[0](*xs)
    for name, (fn, _, _) in impls.items():
        torch.testing.assert_close(fn(*xs), want, rtol=1e-4, atol=1e-5, msg=name)


def test_chunk_tiles_parses_every_field():
    assert chunk_tiles("chunk=32,warps=8,block_v=16,stages=3,precision=ieee,inverse=blocks") == ChunkTiles(
        chunk=32, warps=8, block_v=16, stages=3, precision="ieee", inverse="blocks"
    )
    assert chunk_tiles(None) == ChunkTiles()
    with pytest.raises(SystemExit, match="unknown field 'fused'"):
        chunk_tiles("fused=1")
    with pytest.raises(SystemExit, match="chunk must be a positive int"):
        chunk_tiles("chunk=big")
